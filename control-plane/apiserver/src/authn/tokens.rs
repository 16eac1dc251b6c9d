//! Bearer tokens that are not JWTs: the static token file (`--token-auth-file`, upstream's
//! CSV format) and bootstrap join tokens (`<id>.<secret>`, Secrets of type
//! `bootstrap.kubernetes.io/token` in kube-system).

use std::path::Path;

use base64::Engine;
use serde_json::Value;
use skiff_core::join::{BOOTSTRAP_SECRET_PREFIX, BOOTSTRAP_SECRET_TYPE};

use super::auth::Error;
pub use crate::config::StaticToken;
use crate::state::State;
use crate::user::UserInfo;
use skiff_core::names;

/// Parse a token file as upstream does (CSV, at least three columns, optional groups column).
pub fn load_token_file(path: &Path) -> Result<Vec<StaticToken>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| Error::ReadTokenFile { path: path.to_path_buf(), source })?;
    parse_token_file(&text).map_err(|(line, message)| Error::TokenFileLine {
        path: path.to_path_buf(),
        line,
        message,
    })
}

pub fn parse_token_file(text: &str) -> Result<Vec<StaticToken>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let cols = csv_fields(line);
        if cols.len() < 3 {
            return Err((i + 1, format!("expected at least 3 columns, found {}", cols.len())));
        }
        if cols[0].is_empty() || cols[1].is_empty() {
            return Err((i + 1, "empty token or user name".into()));
        }
        let groups = cols
            .get(3)
            .map(|g| {
                g.split(',').map(str::trim).filter(|g| !g.is_empty()).map(String::from).collect()
            })
            .unwrap_or_default();
        out.push(StaticToken {
            token: cols[0].clone(),
            user: UserInfo {
                name: cols[1].clone(),
                uid: cols[2].clone(),
                groups,
                ..Default::default()
            },
        });
    }
    Ok(out)
}

/// Split one CSV line (double quotes enclose fields with commas; `""` is a quote).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

/// A string field of a Secret, from `data` (base64) or `stringData`.
fn secret_field(secret: &Value, key: &str) -> Option<String> {
    if let Some(v) = secret.pointer(&format!("/data/{key}")).and_then(Value::as_str) {
        let bytes = base64::engine::general_purpose::STANDARD.decode(v).ok()?;
        return String::from_utf8(bytes).ok();
    }
    secret.pointer(&format!("/stringData/{key}")).and_then(Value::as_str).map(String::from)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bootstrap token Secret of `id` when it exists, is valid for authentication, matches
/// `secret` and has not expired.
pub fn bootstrap_secret(state: &State, id: &str, secret: &str) -> Option<Value> {
    let rt = state.registry.find("", "v1", "secrets")?;
    let key = rt.key(Some("kube-system"), &format!("{BOOTSTRAP_SECRET_PREFIX}{id}"));
    let obj = state.cache.resource(rt).get(&key)?.value();
    if obj.get("type").and_then(Value::as_str) != Some(BOOTSTRAP_SECRET_TYPE) {
        return None;
    }
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        return None;
    }
    if secret_field(&obj, "token-id").as_deref() != Some(id) {
        return None;
    }
    let stored = secret_field(&obj, "token-secret")?;
    if !constant_time_eq(stored.as_bytes(), secret.as_bytes()) {
        return None;
    }
    if secret_field(&obj, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return None;
    }
    if let Some(exp) = secret_field(&obj, "expiration") {
        let exp: jiff::Timestamp = exp.parse().ok()?;
        if exp <= jiff::Timestamp::now() {
            return None;
        }
    }
    Some(obj)
}

/// `system:bootstrap:<id>` in `system:bootstrappers` (plus the Secret's auth-extra-groups).
pub fn authenticate_bootstrap(state: &State, id: &str, secret: &str) -> Option<UserInfo> {
    let obj = bootstrap_secret(state, id, secret)?;
    let mut groups = vec![names::BOOTSTRAPPERS.to_string()];
    if let Some(extra) = secret_field(&obj, "auth-extra-groups") {
        groups.extend(
            extra
                .split(',')
                .map(str::trim)
                .filter(|g| g.starts_with("system:bootstrappers:"))
                .map(String::from),
        );
    }
    Some(UserInfo { name: format!("system:bootstrap:{id}"), groups, ..Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_core::join::{new_bootstrap_token, parse_bootstrap};

    #[test]
    fn parses_token_file() {
        let t = parse_token_file("# c\nabc,alice,1001,\"dev,ops\"\nxyz,bob,1002\n").unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].token, "abc");
        assert_eq!(t[0].user.name, "alice");
        assert_eq!(t[0].user.uid, "1001");
        assert_eq!(t[0].user.groups, vec!["dev", "ops"]);
        assert!(t[1].user.groups.is_empty());
        assert_eq!(parse_token_file("a,b\n").unwrap_err().0, 1);
    }

    #[test]
    fn bootstrap_token_shape() {
        assert_eq!(
            parse_bootstrap("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        assert!(parse_bootstrap("abcdeF.0123456789abcdef").is_none());
        assert!(parse_bootstrap("abcdef.0123456789abcde").is_none());
        let (tok, secret) = new_bootstrap_token(std::time::Duration::from_secs(60));
        let (id, _) = parse_bootstrap(&tok).unwrap();
        assert_eq!(secret["metadata"]["name"], format!("bootstrap-token-{id}"));
    }
}
