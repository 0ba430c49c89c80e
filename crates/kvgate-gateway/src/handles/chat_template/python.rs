//! The Python behaviour that Hugging Face's chat-template environment has and minijinja does not:
//! `json.dumps` (HF's `tojson` filter), Python's `repr` of floats, lists and dicts (what Jinja2
//! prints for `{{ value }}`) and `datetime.now().strftime` (HF's `strftime_now`).

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write as _;

/// How `json.dumps` lays out a value: HF calls it as
/// `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`.
pub(crate) struct JsonStyle {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: a newline and `s` once per level before each item.
    pub indent: Option<String>,
    /// Between items and between a key and its value: `(", ", ": ")` on one line, `(",", ": ")`
    /// with an indent, unless given.
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl JsonStyle {
    /// Python's defaults for these arguments (`separators=None` picks by `indent`).
    pub fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> JsonStyle {
        let (item_separator, key_separator) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        JsonStyle {
            ensure_ascii,
            indent,
            item_separator,
            key_separator,
            sort_keys,
        }
    }
}

/// A template dict with the keys in `pairs`' order (as a Python dict literal keeps them).
pub(crate) fn dict<K: Into<Value>>(pairs: impl IntoIterator<Item = (K, Value)>) -> Value {
    Value::from(
        pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v))
            .collect::<indexmap::IndexMap<Value, Value>>(),
    )
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", value.kind()),
    )
}

std::thread_local! {
    /// Most bytes one `json_dumps` may produce on this thread: set around a render by
    /// [`with_output_limit`] (a deep `tools` schema printed with `indent` grows ~100× otherwise).
    static OUTPUT_LIMIT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Runs `f` with [`json_dumps`] limited to `limit` bytes of output on this thread.
pub(crate) fn with_output_limit<T>(limit: usize, f: impl FnOnce() -> T) -> T {
    let before = OUTPUT_LIMIT.with(|l| l.replace(limit));
    let out = f();
    OUTPUT_LIMIT.with(|l| l.set(before));
    out
}

fn over_limit(out: &str) -> Result<(), Error> {
    if out.len() > OUTPUT_LIMIT.with(std::cell::Cell::get) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson output over the rendering budget",
        ));
    }
    Ok(())
}

/// `json.dumps(value, ...)` with `style`. Undefined values and objects that are neither lists
/// nor dicts are an error, as in Python; so is output beyond the thread's limit
/// ([`with_output_limit`]).
pub(crate) fn json_dumps(value: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_json(&mut out, value, style, 0)?;
    Ok(out)
}

fn newline_indent(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    over_limit(out)?;
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value, true),
        ValueKind::String => {
            write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline_indent(out, style, depth + 1);
                write_json(out, item, style, depth + 1)?;
            }
            newline_indent(out, style, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline_indent(out, style, depth + 1);
                write_json_str(out, key, style.ensure_ascii);
                out.push_str(&style.key_separator);
                write_json(out, item, style, depth + 1)?;
            }
            newline_indent(out, style, depth);
            out.push('}');
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// A dict key as `json.dumps` writes it: strings as they are, numbers, booleans and None as
/// their JSON text.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key, true);
            Ok(s)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

/// An int as its digits; a float as Python's `repr` (`json` writes `NaN`, `Infinity`,
/// `-Infinity`; `repr` writes `nan`, `inf`, `-inf`).
fn write_number(out: &mut String, value: &Value, json: bool) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    out.push_str(&float_repr(f, json));
}

/// Python's `repr(float)`: the shortest digits that round-trip, fixed notation when the
/// decimal exponent is in [-4, 16), else `d.ddde±XX`.
pub(crate) fn float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 { format!("-{s}") } else { s.into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.5e-5", "1e16", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if (point as usize) >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

/// A JSON string literal as `json.dumps` writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`,
/// other controls as `\u00XX`; with `ensure_ascii` also every non-ASCII character (and DEL) as
/// `\uXXXX`, astral ones as a surrogate pair.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// What Jinja2 prints for `{{ value }}`: `str(value)`, which is `repr` for lists and dicts
/// (`['a', 1, None, True]`, `{'k': 1.0}`) and floats (`1e+20`). `None` for anything this
/// function does not handle, which minijinja then prints itself.
pub(crate) fn python_str(value: &Value) -> Option<String> {
    match value.kind() {
        ValueKind::Number if !value.is_integer() => {
            Some(float_repr(f64::try_from(value.clone()).ok()?, false))
        }
        ValueKind::Seq | ValueKind::Map => {
            let mut out = String::new();
            write_repr(&mut out, value).ok()?;
            Some(out)
        }
        _ => None,
    }
}

fn write_repr(out: &mut String, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, false),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let item = value.get_item(&key)?;
                write_repr(out, &key)?;
                out.push_str(": ");
                write_repr(out, &item)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text has a `'` and no `"`; `\\`, `\n`, `\r`,
/// `\t` and other non-printable ASCII escaped (non-ASCII printable characters kept).
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `datetime.now().strftime(format)` for `seconds` since the Unix epoch, in UTC (the pods'
/// clock zone in a container, as a rule). Directives: `%a %A %b %B %d %e %H %I %j %m %M %p %S
/// %y %Y %%` (`%Z`, `%z`: empty, as for a naive `datetime`), and the glibc `-` flag (`%-d`: no padding); anything else is kept as written.
pub(crate) fn strftime_utc(format: &str, seconds: i64) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |v: i64, width: usize| {
            if unpadded {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        match chars.next() {
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('d') => out.push_str(&num(day, 2)),
            Some('e') => out.push_str(&if unpadded {
                day.to_string()
            } else {
                format!("{day:2}")
            }),
            Some('H') => out.push_str(&num(hour, 2)),
            Some('I') => out.push_str(&num(hour12, 2)),
            Some('j') => out.push_str(&num(day_of_year, 3)),
            Some('m') => out.push_str(&num(month, 2)),
            Some('M') => out.push_str(&num(minute, 2)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('S') => out.push_str(&num(second, 2)),
            Some('y') => out.push_str(&num(year.rem_euclid(100), 2)),
            Some('Y') => out.push_str(&year.to_string()),
            // `datetime.now()` is naive: no zone name, no offset.
            Some('Z' | 'z') => {}
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month 1–12, day 1–31), proleptic Gregorian (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(v: &Value, indent: Option<&str>) -> String {
        let style = JsonStyle::new(false, indent.map(str::to_string), None, false);
        json_dumps(v, &style).unwrap()
    }

    #[test]
    fn json_dumps_uses_pythons_separators_and_keeps_key_order() {
        let v = dict([
            ("z", Value::from(1)),
            (
                "a",
                Value::from(vec![Value::from(1.0), Value::from(()), Value::from(true)]),
            ),
            ("é", Value::from("<b>&'\"\n\u{1}")),
        ]);
        assert_eq!(
            dumps(&v, None),
            r#"{"z": 1, "a": [1.0, null, true], "é": "<b>&'\"\n\u0001"}"#
        );
        assert_eq!(
            dumps(&v, Some("  ")),
            "{\n  \"z\": 1,\n  \"a\": [\n    1.0,\n    null,\n    true\n  ],\n  \"é\": \"<b>&'\\\"\\n\\u0001\"\n}"
        );
        let empty = dict([("k", Value::from(Vec::<Value>::new()))]);
        assert_eq!(dumps(&empty, Some(" ")), "{\n \"k\": []\n}");
    }

    #[test]
    fn json_dumps_options_sort_keys_separators_and_ensure_ascii() {
        let v = dict([("b", Value::from("é😀")), ("a", Value::from(2))]);
        let style = JsonStyle::new(true, None, Some((",".into(), ":".into())), true);
        assert_eq!(
            json_dumps(&v, &style).unwrap(),
            r#"{"a":2,"b":"\u00e9\ud83d\ude00"}"#
        );
        assert!(json_dumps(&Value::UNDEFINED, &style).is_err());
    }

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e20, "1.5e+20"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123.456, "123.456"),
            (0.0, "0.0"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f, false), want, "{f}");
        }
        assert_eq!(float_repr(f64::INFINITY, true), "Infinity");
        assert_eq!(float_repr(f64::NEG_INFINITY, false), "-inf");
    }

    #[test]
    fn containers_print_as_python_repr() {
        let v = Value::from(vec![
            Value::from("a'b"),
            Value::from("c"),
            Value::from(()),
            Value::from(false),
            dict([("k", Value::from(1.5))]),
        ]);
        assert_eq!(
            python_str(&v).unwrap(),
            r#"["a'b", 'c', None, False, {'k': 1.5}]"#
        );
        assert_eq!(python_str(&Value::from("text")), None);
        assert_eq!(python_str(&Value::from(3)), None);
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-07-26 09:05:03 UTC, a Friday, day 208.
        let t = 1_721_984_703;
        assert_eq!(strftime_utc("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime_utc("%A %B %-d, %y %H:%M:%S %I%p %j %e %Z%z %% %q", t),
            "Friday July 26, 24 09:05:03 09AM 208 26  % %q"
        );
        assert_eq!(strftime_utc("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(strftime_utc("%Y-%m-%d", 951_782_400), "2000-02-29");
    }
}
