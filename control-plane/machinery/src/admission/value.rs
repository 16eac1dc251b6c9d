//! Small helpers to default fields of objects held as `serde_json::Value` in place, with
//! Go's notion of "unset" (absent, null, or the zero value for strings).

use serde_json::{Map, Value};

pub type Obj = Map<String, Value>;

/// The object under `key`, if it is one.
pub fn child<'a>(m: &'a mut Obj, key: &str) -> Option<&'a mut Obj> {
    m.get_mut(key).and_then(Value::as_object_mut)
}

/// The object under `key`, created (or replacing a null) when absent.
pub fn ensure<'a>(m: &'a mut Obj, key: &str) -> Option<&'a mut Obj> {
    let v = m.entry(key).or_insert_with(|| Value::Object(Obj::new()));
    if v.is_null() {
        *v = Value::Object(Obj::new());
    }
    v.as_object_mut()
}

/// Every object element of the array under `key`.
pub fn each<'a>(m: &'a mut Obj, key: &str) -> impl Iterator<Item = &'a mut Obj> {
    m.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn unset(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        _ => false,
    }
}

/// Sets `key` to `val` when it is absent, null or "" (a Go string or pointer zero value).
pub fn default(m: &mut Obj, key: &str, val: impl Into<Value>) {
    set_if(m, key, val, |v| unset(Some(v)));
}

/// Sets `key` to `val` when absent or null (a Go pointer; "" stays).
pub fn default_ptr(m: &mut Obj, key: &str, val: impl Into<Value>) {
    set_if(m, key, val, Value::is_null);
}

/// Sets `key` to `val` when absent or when `replace` says so of its value. One search of
/// the map (defaults are mostly absent, so the key is owned up front).
fn set_if(m: &mut Obj, key: &str, val: impl Into<Value>, replace: impl Fn(&Value) -> bool) {
    match m.entry(key) {
        serde_json::map::Entry::Vacant(e) => {
            e.insert(val.into());
        }
        serde_json::map::Entry::Occupied(mut e) => {
            if replace(e.get()) {
                e.insert(val.into());
            }
        }
    }
}

pub fn str_of<'a>(m: &'a Obj, key: &str) -> &'a str {
    m.get(key).and_then(Value::as_str).unwrap_or_default()
}

pub fn is_set(m: &Obj, key: &str) -> bool {
    !matches!(m.get(key), None | Some(Value::Null))
}
