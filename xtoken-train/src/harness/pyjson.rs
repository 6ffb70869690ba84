//! JSON as Python's `json.dumps(…, ensure_ascii=False)` writes it, which is how
//! lm-evaluation-harness writes its records and what its `doc_hash` hashes: `", "` and `": "`
//! between items (`","` and a new line with `indent`), floats as Python's `repr`, non-ASCII
//! text as it is, keys in the order they were inserted.

use serde_json::Value;

/// `json.dumps(value, ensure_ascii=False)`: one line.
pub fn dumps(value: &Value) -> String {
    let mut out = String::new();
    write(value, None, 0, &mut out);
    out
}

/// `json.dumps(value, indent=indent, ensure_ascii=False)`.
pub fn dumps_indented(value: &Value, indent: usize) -> String {
    let mut out = String::new();
    write(value, Some(indent), 0, &mut out);
    out
}

fn write(value: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            // serde_json holds finite floats only: no NaN or Infinity to write.
            (_, _, Some(x)) => out.push_str(&python_str(x)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => string(s, out),
        Value::Array(items) => {
            let items = items.iter().map(|item| (None, item));
            container(('[', ']'), items, indent, depth, out)
        }
        Value::Object(map) => {
            let items = map.iter().map(|(k, v)| (Some(k.as_str()), v));
            container(('{', '}'), items, indent, depth, out)
        }
    }
}

fn container<'a>(
    (open, close): (char, char),
    items: impl ExactSizeIterator<Item = (Option<&'a str>, &'a Value)>,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) {
    out.push(open);
    if items.len() == 0 {
        out.push(close);
        return;
    }
    let line = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    };
    for (i, (key, value)) in items.enumerate() {
        if i > 0 {
            out.push_str(if indent.is_some() { "," } else { ", " });
        }
        line(out, depth + 1);
        if let Some(key) = key {
            string(key, out);
            out.push_str(": ");
        }
        write(value, indent, depth + 1, out);
    }
    line(out, depth);
    out.push(close);
}

/// A JSON string as Python escapes it with `ensure_ascii=False`: quote, backslash and control
/// characters only.
fn string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `str` writes it: the shortest digits that read back the same, positional
/// for decimal exponents from -4 to 15 (a whole number with `.0`), else `1.5e-07`, `1e+16`.
pub fn python_str(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let positional = format!("{x}");
        if positional.contains('.') {
            positional
        } else {
            format!("{positional}.0")
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Python's `str` of each value, as printed by Python 3.11.
    #[test]
    fn floats_read_as_python_writes_them() {
        let cases = [
            (-7.554382801055908, "-7.554382801055908"),
            (-160.0166473388672, "-160.0166473388672"),
            (-2.0, "-2.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (0.0001, "0.0001"),
            (1e-05, "1e-05"),
            (-3.25e-07, "-3.25e-07"),
            (123456789012345.0, "123456789012345.0"),
            (1e16, "1e+16"),
            (1.5e300, "1.5e+300"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (value, python) in cases {
            assert_eq!(python_str(value), python, "{value:e}");
        }
    }

    /// What Python 3.11's `json.dumps(v, ensure_ascii=False)` and `json.dumps(v, indent=2,
    /// ensure_ascii=False)` print for the same value.
    #[test]
    fn dumps_as_python() {
        let value = json!({
            "b": [1, 2.5, 1e-7, -0.0, true, null],
            "a": "é\"\\\n\t\u{1}",
            "e": [],
            "o": {},
            "n": {"x": [3]}
        });
        assert_eq!(
            dumps(&value),
            r#"{"b": [1, 2.5, 1e-07, -0.0, true, null], "a": "é\"\\\n\t\u0001", "e": [], "o": {}, "n": {"x": [3]}}"#
        );
        assert_eq!(
            dumps_indented(&value, 2),
            "{\n  \"b\": [\n    1,\n    2.5,\n    1e-07,\n    -0.0,\n    true,\n    null\n  ],\n  \
             \"a\": \"é\\\"\\\\\\n\\t\\u0001\",\n  \"e\": [],\n  \"o\": {},\n  \"n\": {\n    \"x\": [\n      \
             3\n    ]\n  }\n}"
        );
    }
}
