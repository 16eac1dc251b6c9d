//! Table-driven tests of admission, one file per API group.

mod apps;
mod batch;
mod core;
mod kubectl;
mod other;
mod pod;
mod service;

use serde_json::Value;

use super::*;

pub const POD: Gvk<'static> = Gvk::new("", "v1", "Pod");

/// Defaulting, create preparation and validation, as the apiserver runs them on create.
pub fn create(gvk: Gvk, mut obj: Value) -> (Value, Vec<FieldError>) {
    default_object(gvk, &mut obj).expect("object");
    prepare_for_create(gvk, &mut obj);
    let errs = validate(gvk, Operation::Create, None, &obj, None);
    (obj, errs)
}

/// Defaulting, update preparation and validation of `new` over the stored `old`.
pub fn update(
    gvk: Gvk,
    sub: Option<&str>,
    old: &Value,
    mut new: Value,
) -> (Value, Vec<FieldError>, Prepared) {
    default_object(gvk, &mut new).expect("object");
    let prepared = prepare_for_update(gvk, sub, &mut new, old);
    let errs = validate(gvk, Operation::Update, sub, &new, Some(old));
    (new, errs, prepared)
}

/// Create that must succeed; returns the admitted object.
pub fn admitted(gvk: Gvk, obj: Value) -> Value {
    let (obj, errs) = create(gvk, obj);
    assert!(errs.is_empty(), "unexpected errors: {}", strings(&errs).join("\n"));
    obj
}

pub fn strings(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(ToString::to_string).collect()
}

/// Asserts the error list holds an error with exactly this rendering, and its reason.
#[track_caller]
pub fn assert_has(errs: &[FieldError], rendered: &str, reason: &str) {
    match errs.iter().find(|e| e.to_string() == rendered) {
        Some(e) => assert_eq!(e.reason(), reason, "reason of {rendered}"),
        None => panic!("missing error\n  {rendered}\nhave:\n  {}", strings(errs).join("\n  ")),
    }
}

/// One row of a rejection table: name, mutation of a valid object, rendered error, reason.
pub type Case<'a> = (&'a str, &'a dyn Fn(&mut Value), &'a str, &'a str);

/// Runs a table of (mutation of a valid object, expected error, reason) rows.
#[track_caller]
pub fn rejects(gvk: Gvk, base: &Value, cases: &[Case]) {
    for (name, mutate, rendered, reason) in cases {
        let mut obj = base.clone();
        mutate(&mut obj);
        let (_, errs) = create(gvk, obj);
        match errs.iter().find(|e| e.to_string() == *rendered) {
            Some(e) => assert_eq!(e.reason(), *reason, "case {name}: reason"),
            None => panic!(
                "case {name}: missing error\n  {rendered}\nhave:\n  {}",
                strings(&errs).join("\n  ")
            ),
        }
    }
}
