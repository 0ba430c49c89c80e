#!/usr/bin/env python3
"""Unit tests of scripts/module_cycles.py on synthetic sources (standard library only).

Run: python3 scripts/test_module_cycles.py   (or: python3 -m unittest discover -s scripts -p 'test_module_cycles.py')
"""
import io
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

sys.dont_write_bytecode = True  # no scripts/__pycache__ left in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import module_cycles as mc  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "module_cycles.py")


def names(text, modpath=("a",)):
    """The (name, item) pairs a file refers to at the crate root."""
    refs, _, _ = mc.scan_file(textwrap.dedent(text), list(modpath))
    return sorted({(name, item) for name, item, _line, _test, _how in refs})


class Workspace:
    """A temporary workspace: crates/<crate>/src/<path> = source."""

    def __init__(self, crates):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        for crate, files in crates.items():
            for path, text in files.items():
                full = os.path.join(self.root, "crates", crate, "src", path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w", encoding="utf-8") as fh:
                    fh.write(textwrap.dedent(text))

    def graph(self, crate, **kw):
        return mc.analyze_crate(os.path.join(self.root, "crates", crate, "src"), name=crate,
                                display_root=self.root, **kw)

    def run(self, *args):
        return subprocess.run([sys.executable, SCRIPT, "--root", self.root, *args],
                              capture_output=True, text=True)

    def close(self):
        self.dir.cleanup()


class Strip(unittest.TestCase):
    def test_keeps_lines_and_columns(self):
        src = 'let s = "crate::x"; // crate::y\n/* crate::z\n */ let t = 1;\n'
        out = mc.strip_comments_and_strings(src)
        self.assertEqual(len(out), len(src))
        self.assertEqual(out.count("\n"), src.count("\n"))
        self.assertNotIn("crate", out)
        self.assertIn("let t = 1;", out)

    def test_nested_block_comment(self):
        out = mc.strip_comments_and_strings("/* a /* crate::x */ crate::y */ crate::z")
        self.assertNotIn("crate::x", out)
        self.assertNotIn("crate::y", out)
        self.assertIn("crate::z", out)

    def test_raw_and_byte_strings(self):
        src = ('r"crate::a" r#"crate::b " still"# br##"crate::c"# "##; b"crate::d" '
               'c"crate::e" crate::f')
        out = mc.strip_comments_and_strings(src)
        for hidden in "abcde":
            self.assertNotIn("crate::" + hidden, out)
        self.assertIn("crate::f", out)

    def test_escaped_quotes(self):
        out = mc.strip_comments_and_strings(r'"a \" crate::x \\" crate::y')
        self.assertNotIn("crate::x", out)
        self.assertIn("crate::y", out)

    def test_chars_and_lifetimes(self):
        src = "fn f<'a>(x: &'a str) -> char { let q = '\"'; let e = '\\''; 'l: loop {} } crate::k"
        out = mc.strip_comments_and_strings(src)
        self.assertIn("'a>", out)
        self.assertIn("'l:", out)
        self.assertIn("crate::k", out)  # the `"` char literal did not open a string

    def test_raw_identifier_is_not_a_raw_string(self):
        out = mc.strip_comments_and_strings('let r#type = 1; crate::m::f("x")')
        self.assertIn("crate::m::f", out)


class Paths(unittest.TestCase):
    def test_use_line(self):
        self.assertEqual(names("use crate::b::Thing;"), [("b", "Thing")])

    def test_inline_paths(self):
        src = """
            fn f(x: &crate::b::B) -> crate::c::C {
                let v: Vec<crate::d::D> = crate::e::make::<u8>();
                match x { crate::f::F::One => {} }
                g(crate::h::H { a: 1 })
            }
        """
        self.assertEqual([n for n, _ in names(src)], ["b", "c", "d", "e", "f", "h"])

    def test_grouped_use(self):
        src = "use crate::{b, c::{self, C}, d::e::{E1, E2 as Two}, self as root, *};"
        self.assertEqual(names(src), [("b", None), ("c", "C"), ("c", "self"), ("d", "e")])

    def test_multi_line_grouped_use(self):
        src = """
            use crate::{
                b::B, // crate::nope
                c::{
                    C1,
                    C2,
                },
            };
        """
        self.assertEqual(names(src), [("b", "B"), ("c", "C1"), ("c", "C2")])

    def test_comments_and_strings_ignored(self):
        src = '''
            //! Docs: [`crate::b::B`]
            /// see crate::c
            /* crate::d */
            fn f() {
                let s = "crate::e::E";
                let r = r#"crate::f"#;
                log!("{}", crate::g::G);
            }
        '''
        self.assertEqual(names(src), [("g", "G")])

    def test_visibility_and_dollar_crate(self):
        src = "pub(crate) fn f() {} pub(crate) struct S; macro_rules! m { () => { $crate::b::f() } }"
        self.assertEqual(names(src), [("b", "f")])

    def test_super_from_top_level_file(self):
        self.assertEqual(names("use super::b::B; fn f() { super::c::g() }", ["a"]),
                         [("b", "B"), ("c", "g")])

    def test_super_inside_module_dir_stays_inside(self):
        # src/a/x.rs: super is `a`, super::super the crate root.
        self.assertEqual(names("use super::y::Y; use super::super::b::B;", ["a", "x"]),
                         [("b", "B")])

    def test_super_in_inline_module(self):
        src = """
            mod tests {
                use super::*;
                use super::super::b::B;
                fn t() { super::helper(); }
            }
        """
        self.assertEqual(names(src, ["a"]), [("b", "B")])

    def test_grouped_super(self):
        self.assertEqual(names("use super::{b::B, c};", ["a"]), [("b", "B"), ("c", None)])

    def test_test_code_is_flagged(self):
        src = """
            use crate::b::B;
            #[cfg(test)]
            mod tests {
                use crate::c::C;
            }
            #[test]
            fn t() { crate::d::f(); }
            #[cfg(not(test))]
            fn p() { crate::e::f(); }
            #[cfg(all(test, feature = "x"))]
            fn q() { crate::f::f(); }
            struct S {
                #[cfg(test)]
                probe: crate::g::G,
                real: crate::h::H,
            }
        """
        refs, _, _ = mc.scan_file(textwrap.dedent(src), ["a"])
        test = {name: is_test for name, _item, _line, is_test, _how in refs}
        self.assertEqual(test, {"b": False, "c": True, "d": True, "e": False, "f": True,
                                "g": True, "h": False})

    def test_line_numbers(self):
        src = "\n/* crate::x\n*/\nuse crate::{\n    b::B,\n};\nfn f() { crate::c::g() }\n"
        refs, _, _ = mc.scan_file(src, ["a"])
        self.assertEqual(sorted((n, line) for n, _i, line, _t, _h in refs), [("b", 5), ("c", 7)])


class Graphs(unittest.TestCase):
    def setUp(self):
        self.ws = None

    def tearDown(self):
        if self.ws:
            self.ws.close()

    def test_cycle_through_inline_path_found(self):
        self.ws = Workspace({"k": {
            "lib.rs": "pub mod flow;\npub mod routing;\npub mod leaf;\n",
            "flow.rs": "use crate::routing::Pick;\nuse crate::leaf::L;\n",
            # The back edge exists only as an inline path in a type.
            "routing.rs": "pub struct Meta<'a> { pub flow: Option<&'a crate::flow::Note> }\n",
            "leaf.rs": "pub struct L;\n",
        }})
        g = self.ws.graph("k")
        self.assertEqual(mc.cycles(g), [["flow", "routing"]])
        ex = g.edges[("routing", "flow")][0]
        self.assertEqual((ex.path, ex.line), (os.path.join("crates", "k", "src", "routing.rs"), 1))
        r = self.ws.run()
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("cycle 1: {flow, routing}", r.stdout)
        self.assertIn("routing -> flow (1 ref; Note): crates/k/src/routing.rs:1", r.stdout)
        self.assertEqual(self.ws.run("--report").returncode, 0)

    def test_acyclic_graph_passes(self):
        self.ws = Workspace({"k": {
            "lib.rs": "pub mod a;\npub mod b;\npub mod c;\npub use a::A;\n",
            "a/mod.rs": "pub mod inner;\nuse crate::b::B;\n// crate::c would close nothing anyway\n",
            "a/inner.rs": "use super::super::c::C;\nuse super::Sibling;\n",
            "b.rs": "use crate::c::C;\nconst S: &str = \"crate::a::A\";\n",
            "c.rs": "/// Uses [`crate::a`].\npub struct C;\n",
        }})
        g = self.ws.graph("k")
        self.assertEqual(sorted(g.edges), [("a", "b"), ("a", "c"), ("b", "c")])
        self.assertEqual(mc.cycles(g), [])
        r = self.ws.run()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("k: no cycle", r.stdout)

    def test_edge_through_root_reexport(self):
        self.ws = Workspace({"k": {
            "lib.rs": "pub mod config;\npub mod predictor;\npub use config::{RouterConfig as Rc};\n",
            "config.rs": "use crate::predictor::Kind;\n",
            "predictor/mod.rs": "fn f(c: &crate::Rc) {}\n",
        }})
        g = self.ws.graph("k")
        self.assertEqual(mc.cycles(g), [["config", "predictor"]])
        self.assertEqual(g.edges[("predictor", "config")][0].via, "Rc")

    def test_cycle_only_in_test_code_is_reported_as_such(self):
        self.ws = Workspace({"k": {
            "lib.rs": "pub mod a;\npub mod b;\n",
            "a.rs": "use crate::b::B;\n#[cfg(test)]\nmod tests;\n",
            "a/tests.rs": "use crate::a::X;\n",
            "b.rs": "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
        }})
        g = self.ws.graph("k")
        self.assertEqual(mc.cycles(g), [["a", "b"]])
        self.assertEqual(mc.cycles(g, production_only=True), [])
        out = io.StringIO()
        mc.report_crate(g, out)
        self.assertIn("test code only", out.getvalue())
        # Excluding tests drops the edge b -> a.
        self.assertEqual(mc.cycles(self.ws.graph("k", include_tests=False)), [])

    def test_test_file_marked_from_cfg_test_mod_decl(self):
        self.ws = Workspace({"k": {
            "lib.rs": "pub mod a;\npub mod b;\n",
            "a/mod.rs": "#[cfg(test)]\nmod tests;\n",
            "a/tests.rs": "use crate::b::B;\n",
            "b.rs": "pub struct B;\n",
        }})
        refs = self.ws.graph("k").edges[("a", "b")]
        self.assertTrue(all(r.test for r in refs))

    def test_crate_filter(self):
        self.ws = Workspace({
            "good": {"lib.rs": "pub mod a;\n", "a.rs": ""},
            "bad-one": {"lib.rs": "pub mod a;\npub mod b;\n",
                        "a.rs": "use crate::b::B;\n", "b.rs": "use crate::a::A;\n"},
        })
        self.assertEqual(self.ws.run("--crate", "good").returncode, 0)
        self.assertEqual(self.ws.run("--crate", "bad_one").returncode, 1)
        self.assertEqual(self.ws.run().returncode, 1)
        r = self.ws.run("--crate", "nope")
        self.assertEqual(r.returncode, 2)
        self.assertIn("no crate", r.stderr)


class Tarjan(unittest.TestCase):
    def test_components(self):
        succ = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": set()}
        comps = sorted(c for c in mc.tarjan(succ.keys(), succ) if len(c) > 1)
        self.assertEqual(comps, [["a", "b", "c"], ["d", "e"]])

    def test_deep_chain_is_iterative(self):
        n = 5000
        succ = {i: {i + 1} for i in range(n)}
        succ[n] = {0}
        comps = mc.tarjan(range(n + 1), succ)
        self.assertEqual(len(comps), 1)
        self.assertEqual(len(comps[0]), n + 1)


if __name__ == "__main__":
    unittest.main()
