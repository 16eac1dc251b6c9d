//! Small helpers over `serde_json`: member lookup by path without parsing a pointer, and
//! object member names borrowed from the input.

/// `value.at(&["metadata", "labels"])`: the member at a path of object member names.
/// What `Value::pointer("/metadata/labels")` finds, without parsing and unescaping the
/// pointer into a `String` per segment (four allocations for a two-segment pointer), which
/// mattered on paths every create takes.
pub trait ValueAt {
    fn at(&self, path: &[&str]) -> Option<&serde_json::Value>;
}

impl ValueAt for serde_json::Value {
    fn at(&self, path: &[&str]) -> Option<&serde_json::Value> {
        path.iter().try_fold(self, |v, member| v.as_object()?.get(*member))
    }
}

/// A JSON object member's name, borrowed from the input unless it had escapes (for
/// visitors that look at member names without allocating them).
pub enum MemberName<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl MemberName<'_> {
    pub fn as_str(&self) -> &str {
        match self {
            MemberName::Borrowed(s) => s,
            MemberName::Owned(s) => s,
        }
    }
}

impl<'de> serde::Deserialize<'de> for MemberName<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> serde::de::Visitor<'de> for NameVisitor {
            type Value = MemberName<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<MemberName<'de>, E> {
                Ok(MemberName::Borrowed(s))
            }

            fn visit_str<E>(self, s: &str) -> Result<MemberName<'de>, E> {
                Ok(MemberName::Owned(s.to_string()))
            }
        }
        d.deserialize_str(NameVisitor)
    }
}
