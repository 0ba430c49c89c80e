//! A request body read as JSON without copying its text: [`Json`] borrows every string from the
//! body as written (escapes left in place, [`JsonStr`]), so a ~400 KB prompt is neither copied
//! nor unescaped into a buffer; its text is handed out piece by piece where it is read
//! ([`JsonStr::for_each_piece`]: the runs between escapes, and each escape decoded).
//!
//! [`parse_with`] is the entry point. Its own reader ([`parse`]) accepts only bodies that
//! serde_json accepts too, and reads them as serde_json's `Value` does (the last of duplicate
//! keys wins, numbers are serde_json's `Number`); any body it does not take (invalid JSON, or
//! valid JSON it is unsure of: nesting over 127 levels, an odd number) is handed to
//! `serde_json::from_slice::<Value>`, so an error is serde_json's, word for word, and a body
//! serde_json takes is never refused. Cost: one UTF-8 check of the body, then `memchr` over each
//! string for its quote or next escape, and a check of each run for control characters; no
//! copy of the text.

use std::borrow::Cow;

use serde_json::{Number, Value};

/// Deepest nesting [`parse`] reads itself (serde_json refuses 128 levels); deeper bodies go to
/// serde_json.
const MAX_DEPTH: usize = 127;

/// A JSON value whose strings borrow from the body (or from a `serde_json::Value`).
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(JsonStr<'a>),
    Array(Vec<Json<'a>>),
    /// The members in body order, duplicates kept; [`Json::get`] reads the last, as
    /// serde_json's `Value` keeps it.
    Object(Vec<(JsonStr<'a>, Json<'a>)>),
}

/// A JSON string as written between its quotes: `raw` with its escapes, `len` the bytes of its
/// text once unescaped.
#[derive(Debug, Clone, Copy)]
pub struct JsonStr<'a> {
    raw: &'a str,
    len: usize,
    escaped: bool,
}

impl PartialEq for JsonStr<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.to_cow() == other.to_cow()
    }
}

impl<'a> JsonStr<'a> {
    /// A string with no escapes: `text` is its text.
    pub fn plain(text: &'a str) -> Self {
        JsonStr {
            raw: text,
            len: text.len(),
            escaped: false,
        }
    }

    /// Bytes of the unescaped text.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The unescaped text, borrowed when it has no escapes.
    pub fn to_cow(&self) -> Cow<'a, str> {
        if !self.escaped {
            return Cow::Borrowed(self.raw);
        }
        let mut text = String::with_capacity(self.len);
        self.for_each_piece(|piece| text.push_str(piece));
        Cow::Owned(text)
    }

    /// True when the unescaped text is `text`.
    pub fn is(&self, text: &str) -> bool {
        if !self.escaped {
            return self.raw == text;
        }
        self.len == text.len() && self.to_cow() == text
    }

    /// The unescaped text in pieces (joined, they are the text): the runs between escapes as
    /// they lie in the body, each escape decoded on its own.
    pub fn for_each_piece(&self, mut piece: impl FnMut(&str)) {
        if !self.escaped {
            piece(self.raw);
            return;
        }
        let mut rest = self.raw;
        while let Some(at) = memchr::memchr(b'\\', rest.as_bytes()) {
            let (run, escape) = rest.split_at(at);
            if !run.is_empty() {
                piece(run);
            }
            let (c, used) = decode_escape(escape.as_bytes());
            let mut buf = [0u8; 4];
            piece(c.encode_utf8(&mut buf));
            rest = escape.get(used..).unwrap_or("");
        }
        if !rest.is_empty() {
            piece(rest);
        }
    }
}

/// The character of the escape at the start of `escape` (`\n`, `\u00e9`, a surrogate pair) and
/// the bytes it takes. Escapes were checked by [`parse`]; anything else decodes as U+FFFD.
fn decode_escape(escape: &[u8]) -> (char, usize) {
    let simple = match escape.get(1) {
        Some(b'"') => '"',
        Some(b'\\') => '\\',
        Some(b'/') => '/',
        Some(b'b') => '\u{8}',
        Some(b'f') => '\u{c}',
        Some(b'n') => '\n',
        Some(b'r') => '\r',
        Some(b't') => '\t',
        Some(b'u') => {
            let Some(high) = hex4(escape, 2) else {
                return ('\u{fffd}', 2);
            };
            if (0xD800..0xDC00).contains(&high) {
                if let Some(low) = hex4(escape, 8) {
                    let c =
                        0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                    return (char::from_u32(c).unwrap_or('\u{fffd}'), 12);
                }
                return ('\u{fffd}', 6);
            }
            return (char::from_u32(u32::from(high)).unwrap_or('\u{fffd}'), 6);
        }
        _ => '\u{fffd}',
    };
    (simple, 2)
}

/// The four hex digits at `bytes[at..at + 4]`.
fn hex4(bytes: &[u8], at: usize) -> Option<u16> {
    let digits = bytes.get(at..at + 4)?;
    let mut n: u16 = 0;
    for d in digits {
        let v = (*d as char).to_digit(16)?;
        n = (n << 4) | v as u16;
    }
    Some(n)
}

impl<'a> Json<'a> {
    /// The member `key` of an object (the last, if repeated); `None` for other values.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        match self {
            Json::Object(members) => members.iter().rev().find(|(k, _)| k.is(key)).map(|m| &m.1),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    pub fn is_string(&self) -> bool {
        matches!(self, Json::String(_))
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Number(n) => n.as_i64(),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Json<'a>]> {
        match self {
            Json::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&JsonStr<'a>> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// A `serde_json::Value` read as this type, its strings borrowed.
    pub fn from_value(value: &'a Value) -> Json<'a> {
        match value {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => Json::Number(n.clone()),
            Value::String(s) => Json::String(JsonStr::plain(s)),
            Value::Array(items) => Json::Array(items.iter().map(Json::from_value).collect()),
            Value::Object(map) => Json::Object(
                map.iter()
                    .map(|(k, v)| (JsonStr::plain(k), Json::from_value(v)))
                    .collect(),
            ),
        }
    }
}

/// `body` read as JSON: by [`parse`] where it can, else by serde_json into `fallback` (see the
/// module docs).
///
/// # Errors
/// serde_json's error for a body that is not JSON.
pub fn parse_with<'a>(
    body: &'a [u8],
    fallback: &'a mut Option<Value>,
) -> Result<Json<'a>, serde_json::Error> {
    if let Some(json) = parse(body) {
        return Ok(json);
    }
    let value: &'a Value = fallback.insert(serde_json::from_slice(body)?);
    Ok(Json::from_value(value))
}

/// `body` read as JSON by kvgate's own reader, or `None` where it does not take it (then
/// serde_json decides: [`parse_with`]). What it takes, serde_json takes and reads alike.
pub fn parse(body: &[u8]) -> Option<Json<'_>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut reader = Reader { text, pos: 0 };
    reader.skip_whitespace();
    let value = reader.value(0)?;
    reader.skip_whitespace();
    (reader.pos == text.len()).then_some(value)
}

struct Reader<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\t' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.pos += 1)
    }

    fn literal(&mut self, word: &str, value: Json<'a>) -> Option<Json<'a>> {
        let end = self.pos + word.len();
        (self.text.get(self.pos..end)? == word).then(|| {
            self.pos = end;
            value
        })
    }

    fn value(&mut self, depth: usize) -> Option<Json<'a>> {
        match self.peek()? {
            b'"' => {
                self.pos += 1;
                self.string().map(Json::String)
            }
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b't' => self.literal("true", Json::Bool(true)),
            b'f' => self.literal("false", Json::Bool(false)),
            b'n' => self.literal("null", Json::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn array(&mut self, depth: usize) -> Option<Json<'a>> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.eat(b']').is_some() {
            return Some(Json::Array(items));
        }
        loop {
            self.skip_whitespace();
            items.push(self.value(depth)?);
            self.skip_whitespace();
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(Json::Array(items));
                }
                _ => return None,
            }
        }
    }

    fn object(&mut self, depth: usize) -> Option<Json<'a>> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.pos += 1;
        let mut members = Vec::new();
        self.skip_whitespace();
        if self.eat(b'}').is_some() {
            return Some(Json::Object(members));
        }
        loop {
            self.skip_whitespace();
            self.eat(b'"')?;
            let key = self.string()?;
            self.skip_whitespace();
            self.eat(b':')?;
            self.skip_whitespace();
            members.push((key, self.value(depth)?));
            self.skip_whitespace();
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    return Some(Json::Object(members));
                }
                _ => return None,
            }
        }
    }

    /// A number as JSON writes it, read by serde_json itself (the same `Number` as its
    /// `Value`; out of range is `None`).
    fn number(&mut self) -> Option<Json<'a>> {
        let start = self.pos;
        let bytes = self.text.as_bytes();
        let digits = |pos: &mut usize| {
            let from = *pos;
            while bytes.get(*pos).is_some_and(u8::is_ascii_digit) {
                *pos += 1;
            }
            *pos > from
        };
        let mut pos = self.pos;
        if bytes.get(pos) == Some(&b'-') {
            pos += 1;
        }
        if bytes.get(pos) == Some(&b'0') {
            pos += 1;
        } else if !digits(&mut pos) {
            return None;
        }
        if bytes.get(pos) == Some(&b'.') {
            pos += 1;
            if !digits(&mut pos) {
                return None;
            }
        }
        if matches!(bytes.get(pos), Some(b'e' | b'E')) {
            pos += 1;
            if matches!(bytes.get(pos), Some(b'+' | b'-')) {
                pos += 1;
            }
            if !digits(&mut pos) {
                return None;
            }
        }
        self.pos = pos;
        serde_json::from_str::<Number>(self.text.get(start..pos)?)
            .ok()
            .map(Json::Number)
    }

    /// The string whose opening quote was just read.
    fn string(&mut self) -> Option<JsonStr<'a>> {
        let start = self.pos;
        let bytes = self.text.as_bytes();
        let mut len = 0;
        let mut escaped = false;
        loop {
            let rest = bytes.get(self.pos..)?;
            let at = memchr::memchr2(b'"', b'\\', rest)?;
            let run = rest.get(..at)?;
            // JSON forbids raw control characters in a string. A fold, not `any`, so that
            // it is vectorised.
            if run.iter().fold(false, |seen, b| seen | (*b < 0x20)) {
                return None;
            }
            len += at;
            self.pos += at;
            if bytes.get(self.pos) == Some(&b'"') {
                let raw = self.text.get(start..self.pos)?;
                self.pos += 1;
                return Some(JsonStr { raw, len, escaped });
            }
            escaped = true;
            let escape = bytes.get(self.pos..)?;
            let (bytes_in_text, used) = match escape.get(1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => (1, 2),
                b'u' => match hex4(escape, 2)? {
                    // A surrogate pair, or nothing this reader takes (serde_json decides).
                    0xD800..=0xDBFF => {
                        if escape.get(6..8)? != b"\\u" {
                            return None;
                        }
                        let low = hex4(escape, 8)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return None;
                        }
                        (4, 12)
                    }
                    0xDC00..=0xDFFF => return None,
                    c => (char::from_u32(u32::from(c))?.len_utf8(), 6),
                },
                _ => return None,
            };
            len += bytes_in_text;
            self.pos += used;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reader's result as a `Value`, to compare with serde_json's.
    fn to_value(json: &Json<'_>) -> Value {
        match json {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => Value::Number(n.clone()),
            Json::String(s) => Value::String(s.to_cow().into_owned()),
            Json::Array(items) => Value::Array(items.iter().map(to_value).collect()),
            Json::Object(members) => Value::Object(
                members
                    .iter()
                    .map(|(k, v)| (k.to_cow().into_owned(), to_value(v)))
                    .collect(),
            ),
        }
    }

    /// What the reader takes, serde_json takes and reads the same.
    fn agrees_with_serde(body: &[u8]) {
        let serde = serde_json::from_slice::<Value>(body);
        if let Some(json) = parse(body) {
            let Ok(value) = serde else {
                panic!(
                    "read {:?}, which serde_json refuses",
                    String::from_utf8_lossy(body)
                );
            };
            assert_eq!(
                to_value(&json),
                value,
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn strings_with_escapes_keep_their_text_and_length() {
        let body = br#"{"a":"x\n\"y\u00e9\ud83d\ude00\/z","b":"plain"}"#;
        let json = parse(body).unwrap();
        let a = json.get("a").and_then(Json::as_str).unwrap();
        assert_eq!(a.to_cow(), "x\n\"y\u{e9}\u{1F600}/z");
        assert_eq!(a.len(), a.to_cow().len());
        let mut pieces = Vec::new();
        a.for_each_piece(|p| pieces.push(p.to_string()));
        assert_eq!(pieces.concat(), "x\n\"y\u{e9}\u{1F600}/z");
        assert!(matches!(
            json.get("b").and_then(Json::as_str).map(JsonStr::to_cow),
            Some(Cow::Borrowed("plain"))
        ));
    }

    #[test]
    fn the_last_duplicate_key_wins_as_in_serde_json() {
        let json = parse(br#"{"k":1,"k":2}"#).unwrap();
        assert_eq!(json.get("k").and_then(Json::as_u64), Some(2));
    }

    #[test]
    fn bodies_serde_json_refuses_are_left_to_it() {
        for body in [
            &br#"{"a":"\ud800"}"#[..],
            br#"{"a":"\udc00x"}"#,
            br#"{"a":"\ud800\u0041"}"#,
            br#"{"a":1e400}"#,
            br#"{"a":01}"#,
            br#"{"a":"tab	in"}"#,
            br#"{"a":1,}"#,
            br#"[1] x"#,
            b"{\"a\":\"\xff\"}",
            br#"{"a":"\x"}"#,
            br#"{"a":tru}"#,
            br#"{"a":-}"#,
        ] {
            assert_eq!(parse(body), None, "{:?}", String::from_utf8_lossy(body));
            assert!(serde_json::from_slice::<Value>(body).is_err());
            let mut fallback = None;
            let ours = parse_with(body, &mut fallback)
                .map(|_| ())
                .map_err(|e| e.to_string());
            let theirs = serde_json::from_slice::<Value>(body)
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_eq!(ours, theirs);
        }
    }

    #[test]
    fn nesting_past_the_readers_depth_goes_to_serde_json() {
        let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
        assert!(parse(deep.as_bytes()).is_some());
        let deeper = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert_eq!(parse(deeper.as_bytes()), None);
        let mut fallback = None;
        let ours = parse_with(deeper.as_bytes(), &mut fallback)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(
            ours,
            Err("recursion limit exceeded at line 1 column 128".to_string())
        );
    }

    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "[\"\\\\\n\t\u{1}a\u{e9}\u{1F600}]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\"\\\\]{0,3}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn reads_serialised_json_as_serde_json_does(value in arbitrary_json(), pretty in any::<bool>()) {
            let body = if pretty {
                serde_json::to_vec_pretty(&value).unwrap()
            } else {
                serde_json::to_vec(&value).unwrap()
            };
            // Compared with serde_json's own read of the bytes: without its `float_roundtrip`
            // feature a float may read back a last digit off the value written.
            let serde: Value = serde_json::from_slice(&body).unwrap();
            let json = parse(&body);
            prop_assert!(json.is_some());
            prop_assert_eq!(&to_value(&json.unwrap()), &serde);
            prop_assert_eq!(value.is_array(), serde.is_array());
        }

        #[test]
        fn never_takes_what_serde_json_refuses(body in prop::collection::vec(any::<u8>(), 0..64)) {
            agrees_with_serde(&body);
        }

        #[test]
        fn never_takes_what_serde_json_refuses_near_json(
            body in "[\\[\\]{}\",:0-9eE.+\\-\\\\ untrefalsx\u{1}\u{e9}]{0,40}"
        ) {
            agrees_with_serde(body.as_bytes());
        }
    }
}
