//! Label and field selectors: parsing upstream's string syntax and matching objects.

use std::collections::BTreeMap;

use super::status::{ApiError, ApiResult};

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (`app=web,tier in (a,b),!legacy`). Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<LabelReq>,
}

impl LabelSelector {
    pub fn parse(s: &str) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let bad = || ApiError::bad_request(format!("unable to parse requirement: {term:?}"));
            let req = if let Some(key) = term.strip_prefix('!') {
                LabelReq::NotExists(valid_key(key.trim()).ok_or_else(bad)?)
            } else if let Some((k, v)) = term.split_once("!=") {
                LabelReq::NotEq(valid_key(k.trim()).ok_or_else(bad)?, v.trim().to_string())
            } else if let Some((k, v)) = term.split_once("==") {
                LabelReq::Eq(valid_key(k.trim()).ok_or_else(bad)?, v.trim().to_string())
            } else if let Some((k, v)) = term.split_once('=') {
                LabelReq::Eq(valid_key(k.trim()).ok_or_else(bad)?, v.trim().to_string())
            } else if let Some((k, set)) = split_set(term, " notin ") {
                LabelReq::NotIn(valid_key(k).ok_or_else(bad)?, set.ok_or_else(bad)?)
            } else if let Some((k, set)) = split_set(term, " in ") {
                LabelReq::In(valid_key(k).ok_or_else(bad)?, set.ok_or_else(bad)?)
            } else {
                LabelReq::Exists(valid_key(term).ok_or_else(bad)?)
            };
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.reqs.iter().all(|r| match r {
            LabelReq::Eq(k, v) => labels.get(k) == Some(v),
            LabelReq::NotEq(k, v) => labels.get(k) != Some(v),
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            LabelReq::Exists(k) => labels.get(k).is_some(),
            LabelReq::NotExists(k) => labels.get(k).is_none(),
        })
    }
}

/// An object's labels as selectors read them: sorted by key, in one exact-size allocation.
/// The watch cache holds one per object, where a `BTreeMap` would allocate a whole node
/// (about 550 bytes) for a single label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(Box<[(String, String)]>);

impl Labels {
    pub fn get(&self, key: &str) -> Option<&str> {
        let i = self.0.binary_search_by(|(k, _)| k.as_str().cmp(key)).ok()?;
        Some(self.0[i].1.as_str())
    }

    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.0.iter().cloned().collect()
    }
}

impl FromIterator<(String, String)> for Labels {
    /// A later duplicate key replaces an earlier one, as in a map.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        let mut pairs: Vec<(String, String)> = iter.into_iter().collect();
        // Stable: equal keys keep their order, and the last of each run is kept.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(String, String)> = Vec::with_capacity(pairs.len());
        for pair in pairs {
            match out.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => out.push(pair),
            }
        }
        Labels(out.into_boxed_slice())
    }
}

/// Split on commas that are not inside a `( ... )` set.
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn split_set<'a>(term: &'a str, op: &str) -> Option<(&'a str, Option<Vec<String>>)> {
    let (k, rest) = term.split_once(op)?;
    let rest = rest.trim();
    let set = rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')).map(|inner| {
        inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect()
    });
    Some((k.trim(), set))
}

fn valid_key(k: &str) -> Option<String> {
    let ok = !k.is_empty()
        && k.len() <= 316
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    ok.then(|| k.to_string())
}

/// A parsed field selector (`metadata.name=web,status.phase!=Running`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parse, rejecting fields the resource does not support (as upstream does, 400).
    pub fn parse(s: &str, supported: impl Fn(&str) -> bool, resource: &str) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid field selector: {term:?}")));
            };
            let field = field.trim();
            if !supported(field) {
                return Err(ApiError::bad_request(format!("field label not supported: {field}"))
                    .with_details("", resource, ""));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Match against the object's selectable fields (missing fields are "").
    pub fn matches(&self, fields: &[(&'static str, String)]) -> bool {
        self.reqs.iter().all(|(f, eq, v)| {
            let actual =
                fields.iter().find(|(name, _)| name == f).map(|(_, v)| v.as_str()).unwrap_or("");
            (actual == v) == *eq
        })
    }

    /// Whether any term selects on one of `fields`.
    pub fn uses_any(&self, fields: &[&str]) -> bool {
        self.reqs.iter().any(|(f, _, _)| fields.contains(&f.as_str()))
    }

    /// The value required for `field` by an equality term, if any (used to narrow lists).
    pub fn required(&self, field: &str) -> Option<&str> {
        self.reqs.iter().find(|(f, eq, _)| f == field && *eq).map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn labels_are_sorted_and_a_later_duplicate_wins() {
        let l = labels(&[("tier", "front"), ("app", "web"), ("b", "1"), ("app", "api")]);
        assert_eq!(l.get("app"), Some("api"));
        assert_eq!(l.get("tier"), Some("front"));
        assert_eq!(l.get("b"), Some("1"));
        assert_eq!(l.get("missing"), None);
        assert_eq!(
            l.to_map(),
            BTreeMap::from([
                ("app".into(), "api".into()),
                ("b".into(), "1".into()),
                ("tier".into(), "front".into())
            ])
        );
        assert_eq!(Labels::default().get(""), None);
    }

    #[test]
    fn label_selectors() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("tier in (front, back)", true),
            ("tier notin (front)", false),
            ("app,!legacy", true),
            ("!app", false),
            ("missing notin (x)", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(LabelSelector::parse("a in (b").is_err());
    }

    #[test]
    fn field_selectors() {
        let fields =
            vec![("metadata.name", "web".to_string()), ("status.phase", "Running".to_string())];
        let ok = |f: &str| f.starts_with("metadata.") || f == "status.phase";
        assert!(FieldSelector::parse("metadata.name=web", ok, "pods").unwrap().matches(&fields));
        assert!(
            !FieldSelector::parse("status.phase!=Running", ok, "pods").unwrap().matches(&fields)
        );
        let e = FieldSelector::parse("spec.bogus=1", ok, "pods").unwrap_err();
        assert_eq!(e.code, http::StatusCode::BAD_REQUEST);
    }
}
