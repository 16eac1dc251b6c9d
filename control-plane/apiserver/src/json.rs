//! Compact JSON of a [`Value`], byte for byte what `serde_json::to_vec` writes, for the
//! objects every write stores. It writes a string that needs no escape (nearly every
//! string of an object) in one copy, where serde_json's serializer copies it in runs
//! between escapes, and it skips the serde state machine around each member.

use serde_json::Value;

/// The compact JSON text of `v` (member order as the map's, as serde_json).
pub fn to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    write_value(&mut out, v);
    out
}

/// [`to_vec`] of an object without the members `skip` of its top-level `metadata`, as if
/// they had been removed first (without copying the object to remove them).
pub fn to_vec_without_metadata(v: &Value, skip: &[&str]) -> Vec<u8> {
    let Value::Object(members) = v else { return to_vec(v) };
    let mut out = Vec::with_capacity(1024);
    write_object(&mut out, members.iter(), |out, name, member| match member {
        Value::Object(meta) if name == "metadata" => {
            let kept = meta.iter().filter(|(n, _)| !skip.contains(&n.as_str()));
            write_object(out, kept, |out, _, m| write_value(out, m));
        }
        _ => write_value(out, member),
    });
    out
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // Numbers are rare and have several representations: serde_json writes them.
        Value::Number(n) => {
            serde_json::to_writer(&mut *out, n).expect("writing a number into a Vec");
        }
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            write_object(out, members.iter(), |out, _, m| write_value(out, m))
        }
    }
}

/// `{"name":<member>,...}`, each member written by `write_member`.
fn write_object<'v>(
    out: &mut Vec<u8>,
    members: impl Iterator<Item = (&'v String, &'v Value)>,
    write_member: impl Fn(&mut Vec<u8>, &str, &'v Value),
) {
    out.push(b'{');
    for (i, (name, member)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, name);
        out.push(b':');
        write_member(out, name, member);
    }
    out.push(b'}');
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        serde_json::to_writer(&mut *out, s).expect("writing a string into a Vec");
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Whether `s` holds a byte serde_json escapes: the quote, the backslash or a control.
/// Most strings of an object are short, so eight bytes are tested at a time as one word.
fn needs_escape(s: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // A byte of `x` is below `n` (n <= 0x80) where this sets its high bit (exactly for
    // bytes below 0x80; a byte with its own high bit set is masked out by `!x`).
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * n as u64) & !x & HIGHS;
    let escape = |x: u64| {
        below(x, 0x20) | below(x ^ (ONES * b'"' as u64), 1) | below(x ^ (ONES * b'\\' as u64), 1)
    };
    let mut words = s.chunks_exact(8);
    for w in &mut words {
        if escape(u64::from_ne_bytes(w.try_into().expect("chunks of eight"))) != 0 {
            return true;
        }
    }
    words.remainder().iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn finds_every_byte_that_needs_an_escape() {
        for len in 0..20 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[at] = b;
                    let expected = b < 0x20 || b == b'"' || b == b'\\';
                    assert_eq!(needs_escape(&s), expected, "byte {b:#x} at {at} of {len}");
                }
            }
            assert!(!needs_escape(&vec![0xff; len]));
            assert!(!needs_escape("é→世🚀".repeat(len).as_bytes()));
        }
    }

    #[test]
    fn writes_what_serde_json_writes() {
        let values = [
            json!(null),
            json!(true),
            json!({}),
            json!([]),
            json!(""),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {}},
                "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80}]}],
                "terminationGracePeriodSeconds": 30, "priority": -1, "overhead": null},
                "status": {"phase": "Pending", "ready": false, "ratio": 0.25, "big": 1e300,
                "max": u64::MAX, "min": i64::MIN}}),
            json!({"quote\"d": "a \"b\" c", "back\\slash": "C:\\dir", "lines": "a\nb\r\tc",
                "controls": "\u{0}\u{1}\u{8}\u{c}\u{1f}", "unicode": "héllo → 世界 🚀",
                "del": "\u{7f}", "slash": "a/b", "": ["", " ", "\u{2028}"]}),
            json!([[[{"a": [1, 2.5, "x", null, {"b": {}}]}]], -0.0, 12345678901234567u64]),
        ];
        for v in values {
            let ours = to_vec(&v);
            assert_eq!(String::from_utf8(ours).unwrap(), serde_json::to_string(&v).unwrap(), "{v}");
        }
    }

    #[test]
    fn leaves_out_only_the_named_members_of_the_top_level_metadata() {
        let skip = ["resourceVersion", "selfLink"];
        for v in [
            json!({"metadata": {"resourceVersion": "7", "name": "p", "selfLink": "/x", "uid": "u"},
                "spec": {"metadata": {"resourceVersion": "kept"}}, "a": 1}),
            json!({"metadata": {"resourceVersion": "7"}}),
            json!({"metadata": {"name": "p"}, "resourceVersion": "kept"}),
            json!({"metadata": "not an object", "kind": "X"}),
            json!({}),
            json!(["not", "an", "object"]),
        ] {
            let mut removed = v.clone();
            if let Some(meta) = removed.get_mut("metadata").and_then(Value::as_object_mut) {
                for name in skip {
                    meta.remove(name);
                }
            }
            let ours = to_vec_without_metadata(&v, &skip);
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string(&removed).unwrap(),
                "{v}"
            );
        }
    }
}
