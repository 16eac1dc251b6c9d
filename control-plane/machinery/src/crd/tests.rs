//! Tests of the CRD schema module. Where a case comes from upstream's tests it says which
//! (`pruning/algorithm_test.go`, `defaulting/algorithm_test.go`,
//! `apis/apiextensions/validation/validation_test.go`, `schema/validation_test.go`).

use serde_json::{Value, json};

use super::schema::parse;
use super::*;
use crate::admission::{FieldError, FieldErrorKind, Path};

const ROOT: &str = "spec.versions[0].schema.openAPIV3Schema";

fn root() -> Path {
    Path::root("spec").child("versions").index(0).child("schema").child("openAPIV3Schema")
}

fn check(schema: Value) -> Vec<String> {
    check_structural(&schema, &root()).iter().map(ToString::to_string).collect()
}

fn strs(v: &[FieldError]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

fn structural(schema: Value) -> Structural {
    match Structural::from_value(&schema) {
        Ok(s) => s,
        Err(errs) => panic!("schema rejected: {:#?}", strs(&errs)),
    }
}

fn validate_cr(s: &Structural, obj: Value) -> Vec<String> {
    strs(&validate(s, &obj, &Path::root("")))
}

/// A Gateway API HTTPRoute, cut down: nested objects, lists of objects, a map list,
/// defaults, enums, patterns, formats, a preserved status.
fn http_route() -> Value {
    let dns_subdomain = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
    let parent_ref = json!({
        "type": "object",
        "required": ["name"],
        "properties": {
            "group": {
                "type": "string",
                "default": "gateway.networking.k8s.io",
                "maxLength": 253,
                "pattern": format!("^$|{}", &dns_subdomain[1..]),
            },
            "kind": {
                "type": "string",
                "default": "Gateway",
                "minLength": 1,
                "maxLength": 63,
                "pattern": "^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$",
            },
            "name": {"type": "string", "minLength": 1, "maxLength": 253},
            "port": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535},
        },
    });
    let hostnames = json!({
        "type": "array",
        "maxItems": 16,
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": 253,
            "pattern": "^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        },
    });
    let path_match = json!({
        "type": "object",
        "default": {"type": "PathPrefix", "value": "/"},
        "properties": {
            "type": {
                "type": "string",
                "default": "PathPrefix",
                "enum": ["Exact", "PathPrefix", "RegularExpression"],
            },
            "value": {"type": "string", "default": "/", "maxLength": 1024},
        },
    });
    let header_match = json!({
        "type": "object",
        "required": ["name", "value"],
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 256},
            "type": {"type": "string", "default": "Exact", "enum": ["Exact", "RegularExpression"]},
            "value": {"type": "string", "minLength": 1, "maxLength": 4096},
        },
    });
    let route_match = json!({
        "type": "object",
        "properties": {
            "path": path_match,
            "headers": {
                "type": "array",
                "maxItems": 16,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": header_match,
            },
            "method": {
                "type": "string",
                "enum": ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"],
            },
        },
    });
    let backend_ref = json!({
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "port": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535},
            "weight": {
                "type": "integer",
                "format": "int32",
                "default": 1,
                "minimum": 0,
                "maximum": 1000000,
            },
        },
    });
    let rule = json!({
        "type": "object",
        "properties": {
            "matches": {
                "type": "array",
                "maxItems": 64,
                "default": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "items": route_match,
            },
            "backendRefs": {"type": "array", "maxItems": 16, "items": backend_ref},
            "timeouts": {
                "type": "object",
                "properties": {
                    "request": {"type": "string", "pattern": "^([0-9]{1,5}(h|m|s|ms)){1,4}$"},
                },
            },
        },
    });
    let spec = json!({
        "type": "object",
        "properties": {
            "parentRefs": {"type": "array", "maxItems": 32, "items": parent_ref},
            "hostnames": hostnames,
            "rules": {
                "type": "array",
                "maxItems": 16,
                "default": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}],
                "items": rule,
            },
        },
        "x-kubernetes-validations": [
            {"rule": "self.rules.size() <= 16", "message": "at most 16 rules"}
        ],
    });
    json!({
        "type": "object",
        "description": "HTTPRoute provides a way to route HTTP requests.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        },
    })
}

// ---------------------------------------------------------------------------------------
// check_structural

#[test]
fn a_gateway_api_like_schema_is_accepted() {
    assert_eq!(check(http_route()), Vec::<String>::new());
    let s = structural(http_route());
    let headers = s
        .child("spec")
        .and_then(|s| s.child("rules"))
        .and_then(Structural::items)
        .and_then(|s| s.child("matches"))
        .and_then(Structural::items)
        .and_then(|s| s.child("headers"));
    let headers = headers.expect("the headers schema");
    assert_eq!(headers.list_type(), ListType::Map);
    assert_eq!(headers.list_map_keys(), ["name".to_string()]);
    let hostnames = s.child("spec").and_then(|s| s.child("hostnames")).expect("hostnames");
    assert_eq!(hostnames.list_type(), ListType::Set);
    let parent_refs = s.child("spec").and_then(|s| s.child("parentRefs")).expect("parentRefs");
    assert_eq!(parent_refs.list_type(), ListType::Atomic);
    assert_eq!(s.map_type(), MapType::Granular);
    assert_eq!(s.child("spec").map(|s| s.x_validations.len()), Some(1));
    assert_eq!(s.child("nope").map(|s| s.ty.clone()), None);
}

#[test]
fn from_value_reports_errors_under_open_api_v3_schema() {
    let errs = Structural::from_value(&json!({"type": "object", "properties": {"a": {}}}))
        .err()
        .map(|e| strs(&e));
    assert_eq!(
        errs,
        Some(vec![
            "openAPIV3Schema.properties[a].type: Required value: must not be empty for specified object fields"
                .to_string()
        ])
    );
}

#[test]
fn types_must_be_specified_except_for_int_or_string_and_preserve_unknown_fields() {
    let got = check(json!({
        "type": "object",
        "properties": {
            "spec": {"properties": {"a": {"type": "string"}}},
            "list": {"type": "array", "items": {}},
            "ios": {"x-kubernetes-int-or-string": true},
            "free": {"x-kubernetes-preserve-unknown-fields": true},
        },
    }));
    assert_eq!(
        got,
        [
            format!(
                "{ROOT}.properties[list].items.type: Required value: must not be empty for specified array items"
            ),
            format!(
                "{ROOT}.properties[spec].type: Required value: must not be empty for specified object fields"
            ),
        ]
    );
    assert_eq!(
        check(json!({"properties": {"a": {"type": "string"}}})),
        [format!("{ROOT}.type: Required value: must not be empty at the root")]
    );
}

#[test]
fn the_root_must_be_an_object_without_additional_properties() {
    // validation_test.go: "require valid types, invalid" (type null at the root).
    assert_eq!(
        check(json!({"type": "null"})),
        [
            format!("{ROOT}.type: Invalid value: \"null\": must be object at the root"),
            format!(
                "{ROOT}.type: Unsupported value: \"null\": supported values: \"array\", \"boolean\", \"integer\", \"number\", \"object\", \"string\""
            ),
            format!(
                "{ROOT}.type: Forbidden: type cannot be set to null, use nullable as an alternative"
            ),
        ]
    );
    // Both the structural rule and the CRD rule report additionalProperties.
    assert_eq!(
        check(json!({
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "additionalProperties": {"type": "string"},
        })),
        [
            format!("{ROOT}.additionalProperties: Forbidden: must not be used at the root"),
            format!(
                "{ROOT}.additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive"
            ),
        ]
    );
    assert_eq!(
        check(json!({"type": "object", "nullable": true})),
        [format!("{ROOT}.nullable: Forbidden: nullable cannot be true at the root")]
    );
}

#[test]
fn arrays_need_items_and_items_must_be_one_schema() {
    assert_eq!(
        check(json!({"type": "object", "properties": {"l": {"type": "array"}}})),
        [format!("{ROOT}.properties[l].items: Required value: must be specified")]
    );
    assert_eq!(
        check(
            json!({"type": "object", "properties": {"l": {"type": "array", "items": [{"type": "string"}]}}})
        ),
        [format!(
            "{ROOT}.properties[l].items: Forbidden: items must be a schema object and not an array"
        )]
    );
}

#[test]
fn unsupported_json_schema_keywords_are_forbidden() {
    let got = check(json!({
        "type": "object",
        "properties": {
            "a": {"type": "string", "$ref": "#/definitions/x"},
            "b": {"type": "string", "id": "b"},
            "c": {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
            "d": {"type": "object", "dependencies": {"x": ["y"]}},
            "e": {"type": "array", "items": {"type": "string"}, "additionalItems": false},
            "f": {"type": "object", "definitions": {"x": {"type": "string"}}},
            "g": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
            "h": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": false},
        },
    }));
    assert_eq!(
        got,
        [
            format!("{ROOT}.properties[a].$ref: Forbidden: $ref is not supported"),
            format!("{ROOT}.properties[b].id: Forbidden: id is not supported"),
            format!(
                "{ROOT}.properties[c].patternProperties: Forbidden: patternProperties is not supported"
            ),
            format!("{ROOT}.properties[d].dependencies: Forbidden: dependencies is not supported"),
            format!(
                "{ROOT}.properties[e].additionalItems: Forbidden: additionalItems is not supported"
            ),
            format!("{ROOT}.properties[f].definitions: Forbidden: definitions is not supported"),
            format!(
                "{ROOT}.properties[g].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic"
            ),
            format!(
                "{ROOT}.properties[h].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive"
            ),
        ]
    );
    // `$schema` is only refused by the structural conversion, reported when nothing else is.
    assert_eq!(
        check(json!({"type": "object", "$schema": "http://json-schema.org/draft-04/schema#"})),
        [format!("{ROOT}: Invalid value: \"\": OpenAPIV3Schema 'schema' is not supported")]
    );
    // `additionalProperties: true` next to properties is tolerated.
    assert_eq!(
        check(
            json!({"type": "object", "properties": {"h": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": true}}})
        ),
        Vec::<String>::new()
    );
}

#[test]
fn logic_junctors_must_only_validate_values() {
    let got = check(json!({
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {"x": {"type": "string"}},
                "anyOf": [
                    {
                        "type": "object",
                        "default": {},
                        "nullable": true,
                        "description": "d",
                        "title": "t",
                        "additionalProperties": {"type": "string"},
                        "x-kubernetes-preserve-unknown-fields": true,
                        "x-kubernetes-embedded-resource": true,
                        "x-kubernetes-int-or-string": true,
                        "x-kubernetes-list-type": "atomic",
                        "x-kubernetes-list-map-keys": ["k"],
                        "x-kubernetes-map-type": "atomic",
                        "x-kubernetes-validations": [{"rule": "true"}],
                    },
                    {"properties": {"x": {"minLength": 1, "type": "string"}, "metadata": {}}},
                ],
            },
        },
    }));
    let a = format!("{ROOT}.properties[a]");
    assert_eq!(
        got,
        [
            format!(
                "{a}.anyOf[0].additionalProperties: Forbidden: must be undefined to be structural"
            ),
            format!("{a}.anyOf[0].default: Forbidden: must be undefined to be structural"),
            format!("{a}.anyOf[0].description: Forbidden: must be empty to be structural"),
            format!("{a}.anyOf[0].nullable: Forbidden: must be false to be structural"),
            format!("{a}.anyOf[0].title: Forbidden: must be empty to be structural"),
            format!("{a}.anyOf[0].type: Forbidden: must be empty to be structural"),
            format!(
                "{a}.anyOf[0].x-kubernetes-embedded-resource: Forbidden: must be false to be structural"
            ),
            format!(
                "{a}.anyOf[0].x-kubernetes-int-or-string: Forbidden: must be false to be structural"
            ),
            format!(
                "{a}.anyOf[0].x-kubernetes-list-map-keys: Forbidden: must be empty to be structural"
            ),
            format!(
                "{a}.anyOf[0].x-kubernetes-list-type: Forbidden: must be undefined to be structural"
            ),
            format!(
                "{a}.anyOf[0].x-kubernetes-map-type: Forbidden: must be undefined to be structural"
            ),
            format!(
                "{a}.anyOf[0].x-kubernetes-preserve-unknown-fields: Forbidden: must be false to be structural"
            ),
            format!(
                "{a}.anyOf[0].x-kubernetes-validations: Forbidden: must be empty to be structural"
            ),
            format!(
                "{a}.anyOf[1].properties[metadata]: Forbidden: must not be specified in a nested context"
            ),
            format!("{a}.anyOf[1].properties[x].type: Forbidden: must be empty to be structural"),
            // The CRD rules run on the junctors too.
            format!(
                "{a}.anyOf[0].type: Invalid value: \"object\": must be array if x-kubernetes-list-type is specified"
            ),
            format!(
                "{a}.anyOf[0].x-kubernetes-list-type: Invalid value: \"atomic\": must be map if x-kubernetes-list-map-keys is non-empty"
            ),
        ]
    );
}

#[test]
fn int_or_string_patterns_may_use_types_in_junctors() {
    let ok = json!({
        "type": "object",
        "properties": {
            "a": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
            "b": {
                "x-kubernetes-int-or-string": true,
                "allOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]}, {"pattern": "^[0-9]+%?$"}],
            },
        },
    });
    assert_eq!(check(ok), Vec::<String>::new());
    // Any other typed junctor is not structural.
    assert_eq!(
        check(json!({
            "type": "object",
            "properties": {"a": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "string"}, {"type": "integer"}]}},
        })),
        [
            format!(
                "{ROOT}.properties[a].anyOf[0].type: Forbidden: must be empty to be structural"
            ),
            format!(
                "{ROOT}.properties[a].anyOf[1].type: Forbidden: must be empty to be structural"
            ),
        ]
    );
    assert_eq!(
        check(json!({
            "type": "object",
            "properties": {"a": {"x-kubernetes-int-or-string": true, "x-kubernetes-preserve-unknown-fields": true}},
        })),
        [format!(
            "{ROOT}.properties[a].x-kubernetes-preserve-unknown-fields: Invalid value: true: must be false if x-kubernetes-int-or-string is true"
        )]
    );
}

#[test]
fn junctor_fields_must_be_specified_structurally() {
    // schema/validation_test.go: "disallowed properties valuevalidation, additional
    // properties structure", with a root path.
    let got = check(json!({
        "type": "object",
        "properties": {"bar": {"type": "string"}, "list": {"type": "string"}},
        "allOf": [{"properties": {"foo": {"minLength": 2}, "list": {"items": {"minLength": 1}}}}],
    }));
    assert_eq!(
        got,
        [
            format!(
                "{ROOT}.properties[foo]: Required value: because it is defined in {ROOT}.allOf[0].properties[foo]"
            ),
            format!(
                "{ROOT}.properties[list].items: Required value: because it is defined in {ROOT}.allOf[0].properties[list].items"
            ),
        ]
    );
}

#[test]
fn root_metadata_may_only_restrict_name_and_generate_name() {
    let ok = json!({
        "type": "object",
        "properties": {
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 20, "pattern": "^[a-z]+$"}},
            },
        },
    });
    assert_eq!(check(ok), Vec::<String>::new());
    let got = check(json!({
        "type": "object",
        "properties": {
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "labels": {"type": "object"}},
            },
            "kind": {"type": "integer"},
        },
    }));
    assert_eq!(
        got,
        [
            format!("{ROOT}.properties[kind].type: Invalid value: \"integer\": must be string"),
            format!(
                "{ROOT}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified"
            ),
        ]
    );
    assert_eq!(
        check(json!({"type": "object", "properties": {"metadata": {"type": "string"}}})),
        [format!("{ROOT}.properties[metadata].type: Invalid value: \"string\": must be object")]
    );
    // Defaults are forbidden in the top-level metadata (and apiVersion/kind).
    assert_eq!(
        check(json!({
            "type": "object",
            "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "default": "x"}}}},
        })),
        [format!(
            "{ROOT}.properties[metadata].properties[name].default: Forbidden: must not be set in top-level metadata"
        )]
    );
}

#[test]
fn embedded_resources_need_object_type_and_properties_or_preserve_unknown_fields() {
    let got = check(json!({
        "type": "object",
        "properties": {
            "a": {"type": "string", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
            "b": {"type": "object", "x-kubernetes-embedded-resource": true},
            "c": {"x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
            "d": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
            "e": {
                "type": "object",
                "x-kubernetes-embedded-resource": true,
                "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}}}},
            },
        },
    }));
    assert_eq!(
        got,
        [
            format!(
                "{ROOT}.properties[a].type: Invalid value: \"string\": must be object if x-kubernetes-embedded-resource is true"
            ),
            format!(
                "{ROOT}.properties[b].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields"
            ),
            format!(
                "{ROOT}.properties[c].type: Required value: must be object if x-kubernetes-embedded-resource is true"
            ),
            format!(
                "{ROOT}.properties[e].properties[metadata].properties[labels].x-kubernetes-embedded-resource: Forbidden: must not be used inside of resource meta"
            ),
        ]
    );
}

#[test]
fn list_and_map_types_are_checked() {
    // validation_test.go: the x-kubernetes-list-type cases.
    let p = |s: Value| check(json!({"type": "object", "properties": {"l": s}}));
    let l = format!("{ROOT}.properties[l]");
    assert_eq!(
        p(json!({"type": "object", "x-kubernetes-list-type": "set"})),
        [format!(
            "{l}.type: Invalid value: \"object\": must be array if x-kubernetes-list-type is specified"
        )]
    );
    assert_eq!(
        p(
            json!({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "invalid"})
        ),
        [format!(
            "{l}.x-kubernetes-list-type: Unsupported value: \"invalid\": supported values: \"atomic\", \"set\", \"map\""
        )]
    );
    assert_eq!(
        p(
            json!({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set", "x-kubernetes-list-map-keys": ["key"]})
        ),
        [format!(
            "{l}.x-kubernetes-list-type: Invalid value: \"set\": must be map if x-kubernetes-list-map-keys is non-empty"
        )]
    );
    assert_eq!(
        p(
            json!({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-map-keys": ["key"]})
        ),
        [format!(
            "{l}.x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys is non-empty"
        )]
    );
    assert_eq!(
        p(json!({"type": "array", "x-kubernetes-list-type": "map"})),
        [
            format!("{l}.items: Required value: must be specified"),
            format!(
                "{l}.x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map"
            ),
            format!(
                "{l}.items: Required value: must have a schema if x-kubernetes-list-type is map"
            ),
        ]
    );
    assert_eq!(
        p(
            json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["key"], "items": {"type": "string"}})
        ),
        [format!(
            "{l}.items.type: Invalid value: \"string\": must be object if parent array's x-kubernetes-list-type is map"
        )]
    );
    assert_eq!(
        p(
            json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["key", "key"],
                 "items": {"type": "object", "required": ["key"], "properties": {"key": {"type": "string"}, "o": {"type": "object"}}}})
        ),
        [format!(
            "{l}.x-kubernetes-list-map-keys: Invalid value: []string{{\"key\", \"key\"}}: must not contain duplicate entries"
        )]
    );
    assert_eq!(
        p(
            json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["o", "missing"],
                 "items": {"type": "object", "nullable": true, "properties": {"o": {"type": "object", "nullable": true}}}})
        ),
        [
            format!(
                "{l}.items.properties[o].type: Invalid value: \"object\": must be a scalar type if parent array's x-kubernetes-list-type is map"
            ),
            format!(
                "{l}.x-kubernetes-list-map-keys: Invalid value: []string{{\"o\", \"missing\"}}: entries must all be names of item properties"
            ),
            format!(
                "{l}.items.nullable: Forbidden: cannot be nullable when x-kubernetes-list-type is map"
            ),
            format!(
                "{l}.items.properties[o].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property"
            ),
            format!(
                "{l}.items.properties[o].nullable: Forbidden: this property is in x-kubernetes-list-map-keys, so it cannot be nullable"
            ),
        ]
    );
    // Set items must be atomic.
    assert_eq!(
        p(
            json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "object", "properties": {"a": {"type": "string"}}}})
        ),
        [format!(
            "{l}.items.x-kubernetes-map-type: Invalid value: null: must be atomic as item of a list with x-kubernetes-list-type=set"
        )]
    );
    assert_eq!(
        p(
            json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}})
        ),
        [format!(
            "{l}.items.x-kubernetes-list-type: Invalid value: \"set\": must be atomic as item of a list with x-kubernetes-list-type=set"
        )]
    );
    assert_eq!(
        p(
            json!({"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "object", "x-kubernetes-map-type": "atomic", "properties": {"a": {"type": "string"}}}})
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        p(json!({"type": "array", "items": {"type": "string"}, "x-kubernetes-map-type": "weird"})),
        [
            format!(
                "{l}.type: Invalid value: \"array\": must be object if x-kubernetes-map-type is specified"
            ),
            format!(
                "{l}.x-kubernetes-map-type: Unsupported value: \"weird\": supported values: \"atomic\", \"granular\""
            ),
        ]
    );
}

#[test]
fn defaults_must_validate_and_be_pruned() {
    // validation_test.go "defaults with enum and metadata" style: a bad scalar default, an
    // unknown field in an object default, a default of an embedded resource.
    let got = check(json!({
        "type": "object",
        "properties": {
            "value": {"type": "integer", "default": "x"},
            "limited": {"type": "string", "maxLength": 2, "default": "abc"},
            "object": {"type": "object", "properties": {"a": {"type": "string"}}, "default": {"a": "x", "b": 1}},
            "embedded": {
                "type": "object",
                "x-kubernetes-embedded-resource": true,
                "x-kubernetes-preserve-unknown-fields": true,
                "default": {"kind": "Foo"},
            },
            "ok": {"type": "object", "properties": {"a": {"type": "string", "default": "y"}}, "default": {"a": "x"}},
        },
    }));
    assert_eq!(
        got,
        [
            format!("{ROOT}.properties[embedded].default.apiVersion: Required value"),
            format!("{ROOT}.properties[limited].default: Too long: may not be more than 2 bytes"),
            format!(
                "{ROOT}.properties[object].default: Invalid value: map[string]interface {{}}{{\"a\":\"x\", \"b\":1}}: must not have unknown fields"
            ),
            format!(
                "{ROOT}.properties[value].default: Invalid value: \"string\":  in body must be of type integer: \"string\""
            ),
        ]
    );
    // Defaults in an embedded resource's metadata must make valid metadata.
    assert_eq!(
        check(json!({
            "type": "object",
            "properties": {
                "embedded": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": true,
                    "properties": {"metadata": {"type": "object", "properties": {"name": {"type": "string", "default": "a/b"}}}},
                },
            },
        })),
        [format!(
            "{ROOT}.properties[embedded].properties[metadata].properties[name].default: Invalid value: \"a/b\": must result in valid metadata: metadata.name: Invalid value: \"a/b\": may not contain '/'"
        )]
    );
    // Defaults are not checked while the schema is not structural.
    assert_eq!(
        check(
            json!({"type": "object", "properties": {"a": {"type": "integer", "default": "x"}, "b": {}}})
        ),
        [format!(
            "{ROOT}.properties[b].type: Required value: must not be empty for specified object fields"
        )]
    );
}

#[test]
fn patterns_must_compile() {
    let got = check(
        json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(abc"}}}),
    );
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0],
        format!(
            "{ROOT}.properties[a].pattern: Invalid value: \"(abc\": must be a valid regular expression, but isn't: error parsing regexp: missing closing ): `(abc`"
        )
    );
}

#[test]
fn validation_rules_are_checked_without_cel() {
    let got = check(json!({
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": " "},
            {"rule": "self.a", "message": " "},
            {"rule": "self.a", "message": "a\nb"},
            {"rule": "self.a ||\nself.b"},
            {"rule": "self.a", "messageExpression": " ", "reason": "Bogus", "fieldPath": " "},
        ],
    }));
    let v = format!("{ROOT}.x-kubernetes-validations");
    assert_eq!(
        got,
        [
            format!("{v}[0].rule: Required value: rule is not specified"),
            format!("{v}[1].message: Invalid value: \" \": must be non-empty if specified"),
            format!("{v}[2].message: Invalid value: \"a\\nb\": must not contain line breaks"),
            format!(
                "{v}[3].message: Required value: message must be specified if rule contains line breaks"
            ),
            format!(
                "{v}[4].messageExpression: Required value: messageExpression must be non-empty if specified"
            ),
            format!(
                "{v}[4].reason: Unsupported value: \"Bogus\": supported values: \"FieldValueDuplicate\", \"FieldValueForbidden\", \"FieldValueInvalid\", \"FieldValueRequired\""
            ),
            format!("{v}[4].fieldPath: Invalid value: \" \": must be non-empty if specified"),
        ]
    );
}

#[test]
fn keywords_of_the_wrong_json_type_are_reported_alone() {
    let got = check(json!({
        "type": "object",
        "properties": {
            "a": {"type": 5},
            "b": {"type": "string", "maxLength": 1.5},
            "c": {"type": "object", "required": ["x", 1]},
            "d": {},
        },
    }));
    assert_eq!(
        got,
        [
            format!("{ROOT}.properties[a].type: Invalid value: 5: must be a string"),
            format!("{ROOT}.properties[b].maxLength: Invalid value: 1.5: must be an integer"),
            format!("{ROOT}.properties[c].required[1]: Invalid value: 1: must be a string"),
        ]
    );
    assert_eq!(
        check(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": false})),
        [format!(
            "{ROOT}.x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined"
        )]
    );
}

// ---------------------------------------------------------------------------------------
// validate

fn route() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {
            "parentRefs": [{"name": "gw", "port": 80}],
            "hostnames": ["example.com", "*.example.org"],
            "rules": [{
                "matches": [{
                    "path": {"type": "PathPrefix", "value": "/api"},
                    "headers": [{"name": "x-a", "value": "1"}, {"name": "x-b", "value": "2"}],
                    "method": "GET",
                }],
                "backendRefs": [{"name": "svc", "port": 8080, "weight": 10}],
                "timeouts": {"request": "10s"},
            }],
        },
        "status": {"anything": ["goes", 1]},
    })
}

#[test]
fn a_valid_route_passes() {
    let s = structural(http_route());
    assert_eq!(validate_cr(&s, route()), Vec::<String>::new());
}

#[test]
fn route_errors_read_like_upstream() {
    let s = structural(http_route());
    let mut r = route();
    r["spec"]["parentRefs"] = json!([
        {"port": "80"},
        {"name": "", "port": 70000, "kind": "9Gateway"},
        {"name": "x".repeat(254), "port": 0},
    ]);
    r["spec"]["hostnames"] = json!(["Example.com", "a.com", "a.com"]);
    r["spec"]["rules"][0]["matches"][0]["path"]["type"] = json!("Regex");
    r["spec"]["rules"][0]["matches"][0]["headers"] =
        json!([{"name": "x", "value": "1"}, {"name": "x", "value": "2"}]);
    r["spec"]["rules"][0]["backendRefs"][0]["weight"] = json!(1.5);
    assert_eq!(
        validate_cr(&s, r),
        [
            "spec.hostnames[0]: Invalid value: \"Example.com\": spec.hostnames[0] in body should match '^(\\*\\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'",
            "spec.parentRefs[0].port: Invalid value: \"string\": spec.parentRefs[0].port in body must be of type integer: \"string\"",
            "spec.parentRefs[0].name: Required value",
            "spec.parentRefs[1].kind: Invalid value: \"9Gateway\": spec.parentRefs[1].kind in body should match '^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$'",
            "spec.parentRefs[1].name: Invalid value: \"\": spec.parentRefs[1].name in body should be at least 1 chars long",
            "spec.parentRefs[1].port: Invalid value: 70000: spec.parentRefs[1].port in body should be less than or equal to 65535",
            "spec.parentRefs[2].name: Too long: may not be more than 253 bytes",
            "spec.parentRefs[2].port: Invalid value: 0: spec.parentRefs[2].port in body should be greater than or equal to 1",
            "spec.rules[0].backendRefs[0].weight: Invalid value: \"float64\": spec.rules[0].backendRefs[0].weight in body must be of type int32: \"float64\"",
            "spec.rules[0].matches[0].path.type: Unsupported value: \"Regex\": supported values: \"Exact\", \"PathPrefix\", \"RegularExpression\"",
            "spec.hostnames[2]: Duplicate value: \"a.com\"",
            "spec.rules[0].matches[0].headers[1]: Duplicate value: map[string]interface {}{\"name\":\"x\"}",
        ]
    );
}

#[test]
fn integers_numbers_and_nulls() {
    let s = structural(json!({
        "type": "object",
        "properties": {
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "o": {"type": "object"},
            "nullable": {"type": "string", "nullable": true},
        },
    }));
    // An integral float is an integer (swag.IsFloat64AJSONInteger); a number accepts integers.
    assert_eq!(validate_cr(&s, json!({"i": 1.0, "n": 3, "nullable": null})), Vec::<String>::new());
    assert_eq!(
        validate_cr(&s, json!({"i": 1.5, "n": "1", "b": "true", "o": [], "nullable": 1})),
        [
            "b: Invalid value: \"string\": b in body must be of type boolean: \"string\"",
            "i: Invalid value: \"number\": i in body must be of type integer: \"number\"",
            "n: Invalid value: \"string\": n in body must be of type number: \"string\"",
            "nullable: Invalid value: \"integer\": nullable in body must be of type string: \"integer\"",
            "o: Invalid value: \"array\": o in body must be of type object: \"array\"",
        ]
    );
    // A null where the schema is not nullable (apply_defaults and
    // prune_non_nullable_nulls normally remove it first).
    assert_eq!(
        validate_cr(&s, json!({"i": null})),
        ["i: Invalid value: \"null\": i in body must be of type integer: \"null\""]
    );
}

#[test]
fn int_or_string_and_preserve_unknown_fields() {
    let s = structural(json!({
        "type": "object",
        "properties": {
            "port": {"x-kubernetes-int-or-string": true},
            "pct": {
                "x-kubernetes-int-or-string": true,
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": "^[0-9]+%$",
            },
            "any": {"x-kubernetes-preserve-unknown-fields": true},
        },
    }));
    assert_eq!(
        validate_cr(&s, json!({"port": 80, "pct": "10%", "any": {"x": [1, {"y": null}]}})),
        Vec::<String>::new()
    );
    assert_eq!(validate_cr(&s, json!({"port": "http", "any": 5})), Vec::<String>::new());
    assert_eq!(
        validate_cr(&s, json!({"port": true, "pct": "10"})),
        [
            "pct: Invalid value: \"10\": pct in body should match '^[0-9]+%$'",
            "port: Invalid value: \"boolean\": port in body must be of type integer,string: \"boolean\"",
        ]
    );
    assert_eq!(
        validate_cr(&s, json!({"pct": false})),
        [
            "pct: Invalid value: \"boolean\": pct in body must be of type integer,string: \"boolean\"",
            "<nil>: Invalid value: \"\": \"pct\" must validate at least one schema (anyOf)",
            "pct: Invalid value: \"boolean\": pct in body must be of type integer: \"boolean\"",
        ]
    );
}

#[test]
fn string_formats_follow_upstream_support() {
    let s = structural(json!({
        "type": "object",
        "properties": {
            "uid": {"type": "string", "format": "uuid"},
            "when": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "ip": {"type": "string", "format": "ipv4"},
            "net": {"type": "string", "format": "cidr"},
            "mail": {"type": "string", "format": "email"},
            "host": {"type": "string", "format": "hostname"},
            "data": {"type": "string", "format": "byte"},
            "wait": {"type": "string", "format": "duration"},
            "link": {"type": "string", "format": "uri"},
            "mac": {"type": "string", "format": "mac"},
            "custom": {"type": "string", "format": "my-own-format"},
            "int32str": {"type": "string", "format": "int32"},
        },
    }));
    let good = json!({
        "uid": "7b8c8e8e-2c5d-4b7a-9e3f-0d2a1c3b4e5f",
        "when": "2024-02-29T10:20:30.5Z",
        "day": "2024-02-29",
        "ip": "10.0.0.1",
        "net": "10.0.0.0/8",
        "mail": "Jane Doe <jane@example.com>",
        "host": "my-host.example.com",
        "data": "aGVsbG8=",
        "wait": "1h30m",
        "link": "https://example.com/a?b=c",
        "mac": "00:1a:2b:3c:4d:5e",
        "custom": "anything",
        "int32str": "not a number",
    });
    assert_eq!(validate_cr(&s, good), Vec::<String>::new());
    let bad = json!({
        "uid": "not-a-uuid",
        "when": "2024-02-30T10:20:30Z",
        "day": "2023-02-29",
        "ip": "10.0.0",
        "net": "10.0.0.0/33",
        "mail": "jane",
        "host": "-bad-",
        "data": "abc",
        "wait": "soon",
        "link": "example.com/x",
        "mac": "00:1a:2b",
    });
    assert_eq!(
        validate_cr(&s, bad),
        [
            "data: Invalid value: \"abc\": data in body must be of type byte: \"abc\"",
            "day: Invalid value: \"2023-02-29\": day in body must be of type date: \"2023-02-29\"",
            "host: Invalid value: \"-bad-\": host in body must be of type hostname: \"-bad-\"",
            "ip: Invalid value: \"10.0.0\": ip in body must be of type ipv4: \"10.0.0\"",
            "link: Invalid value: \"example.com/x\": link in body must be of type uri: \"example.com/x\"",
            "mac: Invalid value: \"00:1a:2b\": mac in body must be of type mac: \"00:1a:2b\"",
            "mail: Invalid value: \"jane\": mail in body must be of type email: \"jane\"",
            "net: Invalid value: \"10.0.0.0/33\": net in body must be of type cidr: \"10.0.0.0/33\"",
            "uid: Invalid value: \"not-a-uuid\": uid in body must be of type uuid: \"not-a-uuid\"",
            "wait: Invalid value: \"soon\": wait in body must be of type duration: \"soon\"",
            "when: Invalid value: \"2024-02-30T10:20:30Z\": when in body must be of type date-time: \"2024-02-30T10:20:30Z\"",
        ]
    );
}

#[test]
fn format_checks_match_strfmt() {
    use super::formats::check as ok;
    for (format, valid, invalid) in [
        ("uuid3", "a3bb189e-8bf9-3888-9912-ace4e6543002", "a3bb189e-8bf9-4888-9912-ace4e6543002"),
        ("uuid4", "7b8c8e8e2c5d4b7a9e3f0d2a1c3b4e5f", "7b8c8e8e-2c5d-4b7a-ce3f-0d2a1c3b4e5f"),
        ("uuid5", "886313e1-3b8a-5372-9b90-0c9aee199e5d", "886313e1-3b8a-4372-9b90-0c9aee199e5d"),
        ("bsonobjectid", "507f1f77bcf86cd799439011", "507f1f77bcf86cd79943901"),
        ("ipv6", "2001:db8::1", "2001:db8::g"),
        ("ipv4", "010.001.0.1", "256.0.0.1"),
        ("cidr", "2001:db8::/64", "2001:db8::/129"),
        ("mac", "0000.5e00.5301", "00-00-5e-00-53"),
        ("isbn10", "0-306-40615-2", "0-306-40615-3"),
        ("isbn13", "978-0-306-40615-7", "978-0-306-40615-8"),
        ("isbn", "9780306406157", "12345"),
        ("creditcard", "4111 1111 1111 1111", "4111 1111 1111 1112"),
        ("ssn", "123-45-6789", "123456789"),
        ("hexcolor", "#fFf", "#ffff"),
        ("rgbcolor", "rgb( 255, 0 ,10 )", "rgb(256,0,0)"),
        ("byte", "YWJjZA==", "YWJjZA="),
        ("date", "2000-02-29", "1900-02-29"),
        ("datetime", "2006-01-02t15:04:05+07:00", "2006-01-02T24:00:00Z"),
        ("date-time", "2006-01-02T15:04:05Z", "2006-01-02"),
        ("duration", "3 days", "5 parsecs"),
        ("duration", "-1.5h", "1.5"),
        ("duration", "300ms", "1x"),
        ("email", "\"john doe\"@example.com", "john@@example.com"),
        ("hostname", "xn--bcher-kva.example", "a..b"),
        ("uri", "mailto:someone@example.com", "://no-scheme"),
        ("uri", "/just/a/path", "http://[::1/x"),
        ("password", "anything at all", ""),
    ] {
        assert!(ok(format, valid), "{format} should accept {valid:?}");
        if format != "password" {
            assert!(!ok(format, invalid), "{format} should refuse {invalid:?}");
        }
    }
    // Formats CRDs do not support are ignored, also on other types.
    assert_eq!(super::formats::crd_format("string", "int32"), "");
    assert_eq!(super::formats::crd_format("integer", "int32"), "int32");
    assert_eq!(super::formats::crd_format("integer", "uuid"), "");
    assert_eq!(super::formats::crd_format("", "date-time"), "date-time");
    assert_eq!(super::formats::crd_format("boolean", "date"), "");
}

#[test]
fn enums_minimums_multiples_and_lengths() {
    let s = structural(json!({
        "type": "object",
        "properties": {
            "e": {"type": "integer", "enum": [1, 2.5, 3]},
            "es": {"type": "string", "enum": ["a", "b"]},
            "eo": {"type": "object", "enum": [{"a": 1}]},
            "max": {"type": "number", "maximum": 10, "exclusiveMaximum": true},
            "min": {"type": "number", "minimum": 1000000},
            "mult": {"type": "integer", "multipleOf": 3},
            "multf": {"type": "number", "multipleOf": 0.5},
            "len": {"type": "string", "maxLength": 3},
            "props": {"type": "object", "minProperties": 1, "maxProperties": 2, "additionalProperties": {"type": "string"}},
            "items": {"type": "array", "minItems": 2, "maxItems": 3, "items": {"type": "integer"}},
        },
    }));
    assert_eq!(
        validate_cr(
            &s,
            json!({"e": 3, "es": "a", "eo": {"a": 1}, "max": 9.99, "min": 1e6, "mult": 9, "multf": 1.5,
                   "len": "äöü", "props": {"a": "b"}, "items": [1, 2]})
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        validate_cr(
            &s,
            json!({"e": 4, "es": "c", "eo": {"a": 2}, "max": 10, "min": 5.5, "mult": 10, "multf": 1.25,
                   "len": "abcd", "props": {}, "items": [1, 2, 3, 4]})
        ),
        [
            "e: Unsupported value: 4: supported values: \"1\", \"2.5\", \"3\"",
            "eo: Unsupported value: map[string]interface {}{\"a\":2}: supported values: \"{\\\"a\\\":1}\"",
            "es: Unsupported value: \"c\": supported values: \"a\", \"b\"",
            "items: Too many: 4: must have at most 3 items",
            "len: Too long: may not be more than 3 bytes",
            "max: Invalid value: 10: max in body should be less than 10",
            "min: Invalid value: 5.5: min in body should be greater than or equal to 1e+06",
            "mult: Invalid value: 10: mult in body should be a multiple of 3",
            "multf: Invalid value: 1.25: multf in body should be a multiple of 0.5",
            "props: Invalid value: 0: props in body should have at least 1 properties",
        ]
    );
    assert_eq!(
        validate_cr(&s, json!({"items": [1], "props": {"a": "x", "b": "y", "c": 1}})),
        [
            "items: Invalid value: 1: items in body should have at least 2 items",
            "props: Too many: 3: must have at most 2 items",
            "props.c: Invalid value: \"integer\": props.c in body must be of type string: \"integer\"",
        ]
    );
}

#[test]
fn logic_junctors_validate_values() {
    let s = structural(json!({
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "string"},
            "n": {"type": "integer"},
            "one": {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "string"}}},
        },
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        "properties-check": null,
        "allOf": [{"properties": {"n": {"minimum": 0}}}, {"properties": {"n": {"maximum": 10}}}],
        "not": {"required": ["one"], "properties": {"one": {"required": ["x", "y"]}}},
    }));
    assert_eq!(validate_cr(&s, json!({"a": "x", "n": 5, "one": {"x": "1"}})), Vec::<String>::new());
    assert_eq!(
        validate_cr(&s, json!({"a": "x", "b": "y", "n": 11, "one": {"x": "1", "y": "2"}})),
        [
            "<nil>: Invalid value: \"\": \"\" must validate one and only one schema (oneOf). Found 2 valid alternatives",
            "n: Invalid value: 11: n in body should be less than or equal to 10",
            "<nil>: Invalid value: \"\": \"\" must validate all the schemas (allOf)",
            "<nil>: Invalid value: \"\": \"\" must not validate the schema (not)",
        ]
    );
    assert_eq!(
        validate_cr(&s, json!({"n": -1})),
        [
            "<nil>: Invalid value: \"\": \"\" must validate one and only one schema (oneOf). Found none valid",
            "a: Required value",
            "n: Invalid value: -1: n in body should be greater than or equal to 0",
            "<nil>: Invalid value: \"\": \"\" must validate all the schemas (allOf)",
        ]
    );
}

#[test]
fn embedded_resources_need_type_meta_and_valid_metadata() {
    let s = structural(json!({
        "type": "object",
        "properties": {
            "template": {
                "type": "object",
                "x-kubernetes-embedded-resource": true,
                "x-kubernetes-preserve-unknown-fields": true,
            },
            "many": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": true,
                    "properties": {"spec": {"type": "object"}},
                },
            },
        },
    }));
    assert_eq!(
        validate_cr(
            &s,
            json!({"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}})
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        validate_cr(
            &s,
            json!({
                "template": {"metadata": {"name": "a/b", "namespace": "Bad_NS", "generateName": "x%"}},
                "many": {
                    "one": {"apiVersion": "a/b/c", "kind": "1Pod"},
                    "two": {"apiVersion": "", "kind": 5, "metadata": {"labels": {"a": 1}}},
                },
            })
        ),
        [
            "many[one].apiVersion: Invalid value: \"a/b/c\": unexpected GroupVersion string: a/b/c",
            "many[one].kind: Invalid value: \"1Pod\": may have mixed case, but should otherwise match: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
            "many[two].apiVersion: Invalid value: \"\": must not be empty",
            "many[two].kind: Invalid value: 5: must be a string",
            "many[two].metadata: Invalid value: map[string]interface {}{\"labels\":map[string]interface {}{\"a\":1}}: json: cannot unmarshal number into Go struct field ObjectMeta.labels of type string",
            "template.apiVersion: Required value",
            "template.kind: Required value",
            "template.metadata.generateName: Invalid value: \"x%\": may not contain '%'",
            "template.metadata.name: Invalid value: \"a/b\": may not contain '/'",
            "template.metadata.namespace: Invalid value: \"Bad_NS\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ]
    );
}

#[test]
fn list_sets_and_maps_have_unique_items_and_keys() {
    let s = structural(json!({
        "type": "object",
        "properties": {
            "set": {"type": "array", "x-kubernetes-list-type": "set", "items": {"x-kubernetes-int-or-string": true}},
            "ports": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["port", "protocol"],
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {"port": {"type": "integer"}, "protocol": {"type": "string", "default": "TCP"}},
                },
            },
        },
    }));
    assert_eq!(
        validate_cr(
            &s,
            json!({"set": [1, "1", 2, 1, 1, "1"],
                   "ports": [{"port": 80, "protocol": "TCP"}, {"port": 80, "protocol": "UDP"}, {"port": 80, "protocol": "TCP"}]})
        ),
        [
            "ports[2]: Duplicate value: map[string]interface {}{\"port\":80, \"protocol\":\"TCP\"}",
            "set[3]: Duplicate value: 1",
            "set[5]: Duplicate value: \"1\"",
        ]
    );
    assert_eq!(
        validate_cr(&s, json!({"ports": [{"port": 1}, "x"]})),
        [
            "ports[1]: Invalid value: \"string\": ports[1] in body must be of type object: \"string\"",
            "ports[1]: Invalid value: \"x\": must be an object for an array of list-type map",
        ]
    );
}

#[test]
fn validation_paths_nest_under_the_given_path() {
    let s = structural(
        json!({"type": "object", "properties": {"a": {"type": "object", "required": ["b"], "properties": {"b": {"type": "string"}}}}}),
    );
    let errs = validate(&s, &json!({"a": {}}), &Path::root("status"));
    assert_eq!(strs(&errs), ["status.a.b: Required value"]);
    assert_eq!(errs[0].kind, FieldErrorKind::Required);
    assert_eq!(errs[0].reason(), "FieldValueRequired");
}

// ---------------------------------------------------------------------------------------
// prune

fn prune_raw(schema: Option<&Structural>, obj: &mut Value, root: bool) -> Vec<String> {
    let mut paths = Vec::new();
    super::pruning::prune_tree(obj, schema, root, Some(&mut paths));
    paths.sort();
    paths
}

#[test]
fn prune_object_arrays() {
    // pruning/algorithm_test.go: "object array", "object array with nil schema",
    // "object array object".
    let s = parse(&json!({"items": {"properties": {"a": {}, "c": {}}}}));
    let mut v = json!([{"a": 1}, {"b": 1}, {"a": 1, "b": 2, "c": 3}]);
    assert_eq!(prune_raw(Some(&s), &mut v, false), ["[1].b", "[2].b"]);
    assert_eq!(v, json!([{"a": 1}, {}, {"a": 1, "c": 3}]));

    let mut v = json!([{"a": 1}, {"b": 1}, {"a": 1, "b": 2, "c": 3}]);
    assert_eq!(prune_raw(None, &mut v, false), ["[0].a", "[1].b", "[2].a", "[2].b", "[2].c"]);
    assert_eq!(v, json!([{}, {}, {}]));

    let s = parse(&json!({"properties": {
        "array": {"items": {"properties": {"a": {}, "c": {}}}},
        "specified": {"properties": {"a": {}, "c": {}}},
    }}));
    let mut v = json!({"array": [{"a": 1}, {"b": 1}, {"a": 1, "b": 2, "c": 3}], "unspecified": {"a": 1}, "specified": {"a": 1, "b": 2, "c": 3}});
    assert_eq!(
        prune_raw(Some(&s), &mut v, false),
        ["array[1].b", "array[2].b", "specified.b", "unspecified"]
    );
    assert_eq!(
        v,
        json!({"array": [{"a": 1}, {}, {"a": 1, "c": 3}], "specified": {"a": 1, "c": 3}})
    );
}

#[test]
fn prune_nested_preserve_unknown_fields() {
    // pruning/algorithm_test.go: "nested x-kubernetes-preserve-unknown-fields".
    let s = parse(&json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": {
            "alpha": {"type": "string"},
            "beta": {"type": "number"},
            "pruning": {
                "type": "object",
                "properties": {
                    "preserving": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "pruning": {"type": "object"},
                },
            },
            "preserving": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "properties": {
                    "preserving": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "preservingUnknownType": {"x-kubernetes-preserve-unknown-fields": true},
                    "pruning": {"type": "object"},
                },
            },
            "preservingAdditionalPropertiesNotInheritingXPreserveUnknownFields": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "additionalProperties": {"type": "object", "properties": {"specified": {"type": "object"}}},
            },
            "preservingAdditionalPropertiesKeyPruneValues": {
                "type": "object",
                "additionalProperties": {"type": "object", "properties": {"specified": {"type": "object"}}},
            },
        },
    }));
    let mut v = json!({
        "unspecified": "bar",
        "alpha": "abc",
        "beta": 42.0,
        "unspecifiedObject": {"unspecified": "bar"},
        "pruning": {
            "unspecified": "bar",
            "unspecifiedObject": {"unspecified": "bar"},
            "pruning": {"unspecified": "bar"},
            "apiVersion": "unknown",
            "preserving": {"unspecified": "bar"},
        },
        "preserving": {
            "unspecified": "bar",
            "unspecifiedObject": {"unspecified": "bar"},
            "pruning": {"unspecified": "bar"},
            "preserving": {"unspecified": "bar"},
            "preservingUnknownType": [{"foo": true}, {"bar": true}],
        },
        "preservingAdditionalPropertiesNotInheritingXPreserveUnknownFields": {
            "foo": {"specified": {"unspecified": "bar"}, "unspecified": "bar"},
        },
        "preservingAdditionalPropertiesKeyPruneValues": {
            "foo": {"specified": {"unspecified": "bar"}, "unspecified": "bar"},
        },
    });
    assert_eq!(
        prune_raw(Some(&s), &mut v, false),
        [
            "preserving.pruning.unspecified",
            "preservingAdditionalPropertiesKeyPruneValues.foo.specified.unspecified",
            "preservingAdditionalPropertiesKeyPruneValues.foo.unspecified",
            "preservingAdditionalPropertiesNotInheritingXPreserveUnknownFields.foo.specified.unspecified",
            "preservingAdditionalPropertiesNotInheritingXPreserveUnknownFields.foo.unspecified",
            "pruning.apiVersion",
            "pruning.pruning.unspecified",
            "pruning.unspecified",
            "pruning.unspecifiedObject",
        ]
    );
    assert_eq!(
        v,
        json!({
            "unspecified": "bar",
            "alpha": "abc",
            "beta": 42.0,
            "unspecifiedObject": {"unspecified": "bar"},
            "pruning": {"pruning": {}, "preserving": {"unspecified": "bar"}},
            "preserving": {
                "unspecified": "bar",
                "unspecifiedObject": {"unspecified": "bar"},
                "pruning": {},
                "preserving": {"unspecified": "bar"},
                "preservingUnknownType": [{"foo": true}, {"bar": true}],
            },
            "preservingAdditionalPropertiesNotInheritingXPreserveUnknownFields": {"foo": {"specified": {}}},
            "preservingAdditionalPropertiesKeyPruneValues": {"foo": {"specified": {}}},
        })
    );
}

#[test]
fn prune_additional_properties() {
    // pruning/algorithm_test.go: "additionalProperties with schema" and "with bool".
    let s = parse(
        &json!({"properties": {"a": {}, "c": {"additionalProperties": {"type": "integer"}}}}),
    );
    let mut v = json!({"a": 1, "b": 1, "c": {"a": 1, "b": 2, "c": {"a": 1}}});
    assert_eq!(prune_raw(Some(&s), &mut v, false), ["b", "c.c.a"]);
    assert_eq!(v, json!({"a": 1, "c": {"a": 1, "b": 2, "c": {}}}));

    let s = parse(&json!({"properties": {"a": {}, "c": {"additionalProperties": false}}}));
    let mut v =
        json!({"a": 1, "b": 1, "c": {"a": 1, "b": 2, "c": {"a": 1, "apiVersion": "unknown"}}});
    assert_eq!(prune_raw(Some(&s), &mut v, false), ["b", "c.c.a", "c.c.apiVersion"]);
    assert_eq!(v, json!({"a": 1, "c": {"a": 1, "b": 2, "c": {}}}));
}

#[test]
fn prune_embedded_resources_keeps_their_type_and_object_meta() {
    // pruning/algorithm_test.go: "x-kubernetes-embedded-resource" (and with root=true).
    let schema = json!({
        "type": "object",
        "properties": {
            "pruned": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object"}}},
            "preserving": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
            "nested": {
                "type": "object",
                "x-kubernetes-embedded-resource": true,
                "properties": {"spec": {"type": "object", "properties": {
                    "embedded": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object"}}},
                }}},
            },
        },
    });
    let resource = |extra: Value| {
        let mut r = json!({
            "apiVersion": "foo/v1",
            "kind": "Foo",
            "unspecified": "bar",
            "metadata": {"name": "instance", "unspecified": "bar"},
            "spec": {"unspecified": "bar"},
        });
        if let (Some(r), Some(extra)) = (r.as_object_mut(), extra.as_object()) {
            r.extend(extra.clone());
        }
        r
    };
    let input = {
        let mut v = resource(json!({}));
        if let Some(o) = v.as_object_mut() {
            o.remove("spec");
        }
        v["pruned"] = resource(json!({}));
        v["preserving"] = resource(json!({}));
        v["nested"] = resource(json!({}));
        v["nested"]["spec"]["embedded"] = resource(json!({}));
        v
    };
    let kept = |spec: Value| json!({"apiVersion": "foo/v1", "kind": "Foo", "metadata": {"name": "instance", "unspecified": "bar"}, "spec": spec});
    let expected_nested = {
        let mut n = kept(json!({}));
        n["spec"]["embedded"] = kept(json!({}));
        n
    };
    let unknown = [
        "nested.spec.embedded.spec.unspecified",
        "nested.spec.embedded.unspecified",
        "nested.spec.unspecified",
        "nested.unspecified",
        "pruned.spec.unspecified",
        "pruned.unspecified",
        "unspecified",
    ];

    // Not as the resource root: the top-level TypeMeta/ObjectMeta go, silently.
    let s = parse(&schema);
    let mut v = input.clone();
    assert_eq!(prune_raw(Some(&s), &mut v, false), unknown);
    assert_eq!(
        v,
        json!({"pruned": kept(json!({})), "preserving": resource(json!({})), "nested": expected_nested.clone()})
    );

    // As the resource root (the public `prune`): they stay.
    let s = structural(schema);
    let mut v = input;
    assert_eq!(prune(&s, &mut v), unknown);
    let mut expected = kept(json!(null));
    if let Some(o) = expected.as_object_mut() {
        o.remove("spec");
        o.insert("pruned".into(), kept(json!({})));
        o.insert("preserving".into(), resource(json!({})));
        o.insert("nested".into(), expected_nested);
    }
    assert_eq!(v, expected);
}

#[test]
fn prune_a_route_reports_unknown_fields_like_field_validation() {
    let s = structural(http_route());
    let mut r = route();
    r["spec"]["foo"] = json!(1);
    r["spec"]["rules"][0]["bar"] = json!({"x": 1});
    r["spec"]["rules"][0]["matches"][0]["headers"][1]["extra"] = json!(true);
    r["metadata"]["unknownMeta"] = json!("kept");
    r["topLevel"] = json!("gone");
    let before_status = r["status"].clone();
    assert_eq!(
        prune(&s, &mut r),
        ["spec.foo", "spec.rules[0].bar", "spec.rules[0].matches[0].headers[1].extra", "topLevel"]
    );
    assert_eq!(r["metadata"]["unknownMeta"], json!("kept"));
    assert_eq!(r["status"], before_status);
    assert_eq!(r, {
        let mut clean = route();
        clean["metadata"]["unknownMeta"] = json!("kept");
        clean
    });
}

// ---------------------------------------------------------------------------------------
// defaults

fn defaulted(schema: Value, obj: Value) -> Value {
    let s = parse(&schema);
    let mut obj = obj;
    apply_defaults(&s, &mut obj);
    obj
}

#[test]
fn defaults_follow_upstream_algorithm_tests() {
    // defaulting/algorithm_test.go, case by case.
    assert_eq!(defaulted(json!({"default": "foo"}), json!(4)), json!(4));
    assert_eq!(defaulted(json!({"items": {"default": "foo"}}), json!([1, 2])), json!([1, 2]));
    assert_eq!(
        defaulted(
            json!({"items": {"properties": {"a": {"default": "A"}, "b": {"default": "B"}, "c": {"default": "C"}}}}),
            json!([{"a": 1}, {"b": 1}, {"c": 1}])
        ),
        json!([{"a": 1, "b": "B", "c": "C"}, {"a": "A", "b": 1, "c": "C"}, {"a": "A", "b": "B", "c": 1}])
    );
    assert_eq!(
        defaulted(
            json!({"properties": {
                "array": {"items": {"properties": {"a": {"default": "A"}, "b": {"default": "B"}}}},
                "object": {"properties": {"a": {"default": "N"}, "b": {"default": "O"}}},
                "additionalProperties": {"additionalProperties": {"properties": {"a": {"default": "alpha"}, "b": {"default": "beta"}}}},
                "foo": {"default": "bar"},
            }}),
            json!({"array": [{"a": 1}, {"b": 2}], "object": {"a": 1}, "additionalProperties": {"x": {"a": 1}, "y": {"b": 2}}})
        ),
        json!({"array": [{"a": 1, "b": "B"}, {"a": "A", "b": 2}], "object": {"a": 1, "b": "O"},
               "additionalProperties": {"x": {"a": 1, "b": "beta"}, "y": {"a": "alpha", "b": 2}}, "foo": "bar"})
    );
    assert_eq!(
        defaulted(
            json!({"items": {"properties": {"a": {"default": "A"}}}}),
            json!([{}, {"a": 1}, {"a": 0}, {"a": 0.0}, {"a": ""}, {"a": null}, {"a": []}, {"a": {}}])
        ),
        json!([{"a": "A"}, {"a": 1}, {"a": 0}, {"a": 0.0}, {"a": ""}, {"a": "A"}, {"a": []}, {"a": {}}])
    );
    assert_eq!(
        defaulted(
            json!({"nullable": true, "items": {"properties": {"a": {"default": "A"}}}}),
            json!([null])
        ),
        json!([null])
    );
    assert_eq!(defaulted(json!({"items": {"default": "A"}}), json!([null])), json!(["A"]));
    assert_eq!(
        defaulted(
            json!({"properties": {"a": {"nullable": true, "default": "A"}}}),
            json!({"a": null})
        ),
        json!({"a": null})
    );
    assert_eq!(
        defaulted(json!({"properties": {"a": {"default": "A"}}}), json!({"a": null})),
        json!({"a": "A"})
    );
    assert_eq!(
        defaulted(
            json!({"additionalProperties": {"nullable": true, "default": "A"}}),
            json!({"a": null})
        ),
        json!({"a": null})
    );
    assert_eq!(
        defaulted(json!({"additionalProperties": {"default": "A"}}), json!({"a": null})),
        json!({"a": "A"})
    );
    assert_eq!(
        defaulted(json!({"additionalProperties": true}), json!({"a": null})),
        json!({"a": null})
    );
}

#[test]
fn defaults_of_a_route() {
    let s = structural(http_route());
    let mut r = json!({"spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "svc"}]}]}, "status": {}});
    apply_defaults(&s, &mut r);
    assert_eq!(
        r,
        json!({
            "spec": {
                "parentRefs": [{"name": "gw", "group": "gateway.networking.k8s.io", "kind": "Gateway"}],
                "rules": [{
                    "backendRefs": [{"name": "svc", "weight": 1}],
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                }],
            },
            "status": {},
        })
    );
    // A missing parent is not created; a missing list with a default is, and is defaulted
    // inside.
    let mut r = json!({"spec": {}});
    apply_defaults(&s, &mut r);
    assert_eq!(
        r,
        json!({"spec": {"rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}]}})
    );
    let mut r = json!({});
    apply_defaults(&s, &mut r);
    assert_eq!(r, json!({}));
    // Defaults are deep copies.
    let mut r = json!({"spec": {"rules": [{"matches": [{}, {}]}]}});
    apply_defaults(&s, &mut r);
    assert_eq!(
        r["spec"]["rules"][0]["matches"][1]["path"],
        json!({"type": "PathPrefix", "value": "/"})
    );
}

#[test]
fn non_nullable_nulls_without_defaults_are_pruned_first() {
    // defaulting/prunenulls_test.go style.
    let s = parse(&json!({"properties": {
        "a": {"type": "string"},
        "b": {"type": "string", "nullable": true},
        "c": {"type": "string", "default": "C"},
        "m": {"additionalProperties": {"type": "string"}},
        "l": {"items": {"type": "string"}},
    }}));
    let mut v = json!({"a": null, "b": null, "c": null, "m": {"x": null, "y": "z"}, "l": [null], "unknown": null});
    prune_non_nullable_nulls(&s, &mut v);
    assert_eq!(v, json!({"b": null, "c": null, "m": {"y": "z"}, "l": [null], "unknown": null}));
    apply_defaults(&s, &mut v);
    assert_eq!(v, json!({"b": null, "c": "C", "m": {"y": "z"}, "l": [null], "unknown": null}));
}

// ---------------------------------------------------------------------------------------
// Go printing and regular expressions

#[test]
fn go_number_and_value_printing() {
    use super::gofmt::{float, json as go_json, value};
    assert_eq!(float(10.0), "10");
    assert_eq!(float(1.5), "1.5");
    assert_eq!(float(123456.0), "123456");
    assert_eq!(float(1e6), "1e+06");
    assert_eq!(float(1234567.0), "1.234567e+06");
    assert_eq!(float(0.0001), "0.0001");
    assert_eq!(float(0.00001), "1e-05");
    assert_eq!(float(-2.5e-10), "-2.5e-10");
    assert_eq!(
        go_json(&json!({"b": 1.0, "a": [1e21, 1e-7, 0.5]})),
        "{\"a\":[1e+21,1e-7,0.5],\"b\":1}"
    );
    assert_eq!(value(&json!("a\"b")), "\"a\\\"b\"");
    assert_eq!(value(&json!(null)), "null");
    assert_eq!(
        value(&json!([1, "x", null, {"k": true}])),
        "[]interface {}{1, \"x\", interface {}(nil), map[string]interface {}{\"k\":true}}"
    );
}

#[test]
fn patterns_use_go_semantics() {
    let m = |p: &str, s: &str| Pattern::new(p).is_match(s);
    // \d, \w, \s and \b are ASCII in Go.
    assert_eq!(m(r"^\d+$", "123"), Some(true));
    assert_eq!(m(r"^\d+$", "١٢٣"), Some(false));
    assert_eq!(m(r"^[\w-]+$", "a_b-c"), Some(true));
    assert_eq!(m(r"^\w+$", "é"), Some(false));
    assert_eq!(m(r"^[^\s]+$", "a\u{a0}b"), Some(true));
    assert_eq!(m(r"\bfoo\b", "a foo b"), Some(true));
    // Unanchored, like Go's MatchString.
    assert_eq!(m("b", "abc"), Some(true));
    // `]` first in a class, `[` and `&&` inside a class are literals in Go.
    assert_eq!(m(r"^[]a]+$", "a]"), Some(true));
    assert_eq!(m(r"^[[a]+$", "[a"), Some(true));
    assert_eq!(m(r"^[a&&b]+$", "&"), Some(true));
    assert_eq!(m(r"^[[:alpha:]]+$", "abc"), Some(true));
    assert_eq!(m(r"^\Q.*\E$", ".*"), Some(true));
    assert_eq!(m(r"^\Q.*\E$", "ab"), Some(false));
    assert_eq!(m(r"^\101$", "A"), Some(true));
    // Go reads a `{` that starts no repeat as a literal.
    assert_eq!(m("^a{$", "a{"), Some(true));
    assert_eq!(m("^a{,2}$", "a{,2}"), Some(true));
    assert_eq!(m("^a{2}$", "aa"), Some(true));
    assert_eq!(m("(", "x"), None);
    // Go's error texts (validation_test.go: "invalid regex pattern").
    let err = |p: &str| Pattern::new(p).error().map(String::from);
    let go = |s: &str| Some(format!("error parsing regexp: {s}"));
    assert_eq!(err("+"), go("missing argument to repetition operator: `+`"));
    assert_eq!(err("(abc"), go("missing closing ): `(abc`"));
    assert_eq!(err("a)"), go("unexpected ): `a)`"));
    assert_eq!(err("x[a"), go("missing closing ]: `[a`"));
    assert_eq!(err(r"\y"), go(r"invalid escape sequence: `\y`"));
    assert_eq!(err("a{2,1}"), go("invalid repeat count: `{2,1}`"));
    assert_eq!(err("a{1001}"), go("invalid repeat count: `{1001}`"));
    assert_eq!(err("(?x)a"), go("invalid or unsupported Perl syntax: `(?x`"));
    assert_eq!(err("(?=a)"), go("invalid or unsupported Perl syntax: `(?=`"));
    assert_eq!(err("[z-a]"), go("invalid character class range: `z-a`"));
    assert_eq!(err("a|*?"), go("missing argument to repetition operator: `*?`"));
    assert_eq!(err("a**"), go("invalid nested repetition operator: `**`"));
    assert_eq!(err("a{2}{3}"), go("invalid nested repetition operator: `{2}{3}`"));
    assert_eq!(err(r"(a)\1"), go(r"invalid escape sequence: `\1`"));
    assert_eq!(err(r"\p{Foo}"), go(r"invalid character class range: `\p{Foo}`"));
    assert_eq!(m("^a*?b+?$", "abb"), Some(true));
    assert_eq!(m("^(?i:AB)(?s).$", "ab\n"), Some(true));
    assert_eq!(m("^(?P<x>a)(?<y>b)$", "ab"), Some(true));
    assert_eq!(err("(?i)^[a-z]+$"), None);
    // Large but valid patterns compile, as in Go.
    assert_eq!(err("^.{0,1000}$"), None);
    assert_eq!(err(r"^[\p{L}\p{N}_-]{1,1000}$"), None);
    assert_eq!(err(r"^(\w+\.)*\w+@(\w+\.)+\w{2,63}$"), None);
    assert_eq!(m(r"^\p{Greek}+\x{41}\pN$", "αβA1"), Some(true));
}

// ---------------------------------------------------------------------------------------
// Upstream's own cases: test/integration/validation_test.go
// (TestNonStructuralSchemaCondition*, TestCustomResourceValidationErrors,
// TestZeroValueValidation) and pkg/apis/apiextensions/validation/validation_test.go.

fn yaml(s: &str) -> Value {
    match serde_saphyr::from_str::<Value>(s) {
        Ok(v) => v,
        Err(e) => panic!("bad test YAML: {e}"),
    }
}

/// The errors of a schema given in YAML, and the expected ones (relative to the root path)
/// sorted like the structural errors upstream sorts.
fn check_yaml(schema: &str) -> Vec<String> {
    check(yaml(schema))
}

fn expect(errs: &[&str]) -> Vec<String> {
    errs.iter().map(|e| format!("{ROOT}{e}")).collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn upstream_forbidden_in_nested_value_validation() {
    let got = check_yaml(
        "
type: object
properties:
  foo:
    type: string
not:
  type: string
  additionalProperties: true
  title: hello
  description: world
  nullable: true
allOf:
- properties:
    foo:
      type: string
      additionalProperties: true
      title: hello
      description: world
      nullable: true
anyOf:
- items:
    type: string
    additionalProperties: true
    title: hello
    description: world
    nullable: true
oneOf:
- properties:
    foo:
      type: string
      additionalProperties: true
      title: hello
      description: world
      nullable: true
",
    );
    let mut want = Vec::new();
    for node in
        [".anyOf[0].items", ".allOf[0].properties[foo]", ".oneOf[0].properties[foo]", ".not"]
    {
        want.push(format!("{node}.type: Forbidden: must be empty to be structural"));
        want.push(format!(
            "{node}.additionalProperties: Forbidden: must be undefined to be structural"
        ));
        want.push(format!("{node}.title: Forbidden: must be empty to be structural"));
        want.push(format!("{node}.description: Forbidden: must be empty to be structural"));
        want.push(format!("{node}.nullable: Forbidden: must be false to be structural"));
    }
    want.push(format!(".items: Required value: because it is defined in {ROOT}.anyOf[0].items"));
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(got, sorted(expect(&want)));
}

#[test]
fn upstream_missing_types() {
    let schema = "
properties:
  foo:
    properties:
      a: {}
  bar:
    items:
      additionalProperties:
        properties:
          a: {}
        items: {}
  abc:
    additionalProperties:
      properties:
        a:
          items:
            additionalProperties:
              items:
";
    let fields = "must not be empty for specified object fields";
    let items = "must not be empty for specified array items";
    let want = [
        format!(".properties[foo].properties[a].type: Required value: {fields}"),
        format!(".properties[foo].type: Required value: {fields}"),
        format!(
            ".properties[abc].additionalProperties.properties[a].items.additionalProperties.type: Required value: {fields}"
        ),
        format!(
            ".properties[abc].additionalProperties.properties[a].items.type: Required value: {items}"
        ),
        format!(
            ".properties[abc].additionalProperties.properties[a].type: Required value: {fields}"
        ),
        format!(".properties[abc].additionalProperties.type: Required value: {fields}"),
        format!(".properties[abc].type: Required value: {fields}"),
        format!(".properties[bar].items.additionalProperties.items.type: Required value: {items}"),
        format!(
            ".properties[bar].items.additionalProperties.properties[a].type: Required value: {fields}"
        ),
        format!(".properties[bar].items.additionalProperties.type: Required value: {fields}"),
        format!(".properties[bar].items.type: Required value: {items}"),
        format!(".properties[bar].type: Required value: {fields}"),
        ".type: Required value: must not be empty at the root".to_string(),
    ];
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(check_yaml(schema), sorted(expect(&want)));

    // With the extensions that allow an empty type.
    let got = check_yaml(
        "
type: object
properties:
  json:
    x-kubernetes-preserve-unknown-fields: true
    properties:
      a: {}
  int-or-string:
    x-kubernetes-int-or-string: true
    properties:
      a: {}
",
    );
    assert_eq!(
        got,
        expect(&[
            ".properties[int-or-string].properties[a].type: Required value: must not be empty for specified object fields",
            ".properties[json].properties[a].type: Required value: must not be empty for specified object fields",
        ])
    );
}

#[test]
fn upstream_structural_completeness() {
    let incomplete = "
type: object
properties:
  b:
    type: object
    properties:
      b:
        type: array
  c:
    type: array
    items:
      type: object
  d:
    type: array
not:
  properties:
    a: {}
    b:
      not:
        properties:
          a: {}
          b:
            items: {}
    c:
      items:
        not:
          items:
            properties:
              a: {}
    d:
      items: {}
allOf:
- properties:
    e: {}
anyOf:
- properties:
    f: {}
oneOf:
- properties:
    g: {}
";
    let because =
        |s: &str, v: &str| format!("{s}: Required value: because it is defined in {ROOT}{v}");
    let want = [
        because(".properties[d].items", ".not.properties[d].items"),
        because(".properties[a]", ".not.properties[a]"),
        because(".properties[b].properties[a]", ".not.properties[b].not.properties[a]"),
        because(".properties[b].properties[b].items", ".not.properties[b].not.properties[b].items"),
        because(".properties[c].items.items", ".not.properties[c].items.not.items"),
        because(".properties[e]", ".allOf[0].properties[e]"),
        because(".properties[f]", ".anyOf[0].properties[f]"),
        because(".properties[g]", ".oneOf[0].properties[g]"),
        // Not in upstream's list (which it only searches): the arrays without items.
        ".properties[b].properties[b].items: Required value: must be specified".to_string(),
        ".properties[d].items: Required value: must be specified".to_string(),
    ];
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(check_yaml(incomplete), sorted(expect(&want)));

    let complete = "
type: object
properties:
  a:
    type: string
  b:
    type: object
    properties:
      a:
        type: string
      b:
        type: array
        items:
          type: string
  c:
    type: array
    items:
      type: array
      items:
        type: object
        properties:
          a:
            type: string
  d:
    type: array
    items:
      type: string
  e:
    type: string
  f:
    type: string
  g:
    type: string
not:
  properties:
    a: {}
    b:
      not:
        properties:
          a: {}
          b:
            items: {}
    c:
      items:
        not:
          items:
            properties:
              a: {}
    d:
      items: {}
allOf:
- properties:
    e: {}
anyOf:
- properties:
    f: {}
oneOf:
- properties:
    g: {}
";
    assert_eq!(check_yaml(complete), Vec::<String>::new());
}

#[test]
fn upstream_metadata_cases() {
    assert_eq!(
        check_yaml("type: object\nproperties:\n  metadata:\n    minimum: 42.0\n"),
        expect(&[
            // Not in upstream's list (which it only searches), but what its code reports too.
            ".properties[metadata].type: Invalid value: \"\": must be object",
            ".properties[metadata].type: Required value: must not be empty for specified object fields",
            ".properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
        ])
    );
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  metadata:
    properties:
      name:
        pattern: \"^[a-z]+$\"
      labels:
        type: object
        maxLength: 4
"
        ),
        expect(&[
            ".properties[metadata].properties[name].type: Required value: must not be empty for specified object fields",
            ".properties[metadata].type: Invalid value: \"\": must be object",
            ".properties[metadata].type: Required value: must not be empty for specified object fields",
            ".properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
        ])
    );
    for ok in [
        "type: object\nproperties:\n  metadata:\n    type: object\n    properties:\n      name:\n        type: string\n        pattern: \"^[a-z]+$\"\n",
        "type: object\nproperties:\n  metadata:\n    type: object\n    properties:\n      generateName:\n        type: string\n        pattern: \"^[a-z]+$\"\n",
        "type: object\nproperties:\n  metadata:\n    type: object\n    properties:\n      name:\n        type: string\n      generateName:\n        type: string\n",
    ] {
        assert_eq!(check_yaml(ok), Vec::<String>::new(), "{ok}");
    }
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  metadata:
    type: object
allOf:
- properties:
    metadata: {}
anyOf:
- properties:
    metadata: {}
oneOf:
- properties:
    metadata: {}
not:
  properties:
    metadata: {}
"
        ),
        sorted(expect(&[
            ".anyOf[0].properties[metadata]: Forbidden: must not be specified in a nested context",
            ".allOf[0].properties[metadata]: Forbidden: must not be specified in a nested context",
            ".oneOf[0].properties[metadata]: Forbidden: must not be specified in a nested context",
            ".not.properties[metadata]: Forbidden: must not be specified in a nested context",
        ]))
    );
}

#[test]
fn upstream_int_or_string_variants() {
    let got = check_yaml(
        "
type: object
properties:
  a:
    x-kubernetes-int-or-string: true
  b:
    x-kubernetes-int-or-string: true
    anyOf:
    - type: integer
    - type: string
    allOf:
    - pattern: abc
  c:
    x-kubernetes-int-or-string: true
    allOf:
    - anyOf:
      - type: integer
      - type: string
    - pattern: abc
    - pattern: abc
  d:
    x-kubernetes-int-or-string: true
    anyOf:
    - type: integer
    - type: string
      pattern: abc
  e:
    x-kubernetes-int-or-string: true
    allOf:
    - anyOf:
      - type: integer
      - type: string
        pattern: abc
    - pattern: abc
  f:
    x-kubernetes-int-or-string: true
    anyOf:
    - type: integer
    - type: string
    - pattern: abc
  g:
    x-kubernetes-int-or-string: true
    anyOf:
    - type: string
    - type: integer
",
    );
    let t = "type: Forbidden: must be empty to be structural";
    let want = [
        format!(".properties[d].anyOf[0].{t}"),
        format!(".properties[d].anyOf[1].{t}"),
        format!(".properties[e].allOf[0].anyOf[0].{t}"),
        format!(".properties[e].allOf[0].anyOf[1].{t}"),
        format!(".properties[f].anyOf[0].{t}"),
        format!(".properties[f].anyOf[1].{t}"),
        format!(".properties[g].anyOf[0].{t}"),
        format!(".properties[g].anyOf[1].{t}"),
    ];
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(got, expect(&want));
}

#[test]
fn upstream_forbidden_vendor_extensions_in_nested_value_validation() {
    let junctor = "
  properties:
    int-or-string:
      x-kubernetes-int-or-string: true
    embedded-resource:
      x-kubernetes-embedded-resource: true
      x-kubernetes-preserve-unknown-fields: true
";
    let schema = format!(
        "
type: object
properties:
  int-or-string:
    x-kubernetes-int-or-string: true
  embedded-resource:
    type: object
    x-kubernetes-embedded-resource: true
    x-kubernetes-preserve-unknown-fields: true
not:{junctor}allOf:
-{junctor}anyOf:
-{junctor}oneOf:
-{junctor}"
    );
    let mut want = Vec::new();
    for j in [".allOf[0]", ".anyOf[0]", ".oneOf[0]", ".not"] {
        for (p, x) in [
            ("embedded-resource", "x-kubernetes-preserve-unknown-fields"),
            ("embedded-resource", "x-kubernetes-embedded-resource"),
            ("int-or-string", "x-kubernetes-int-or-string"),
        ] {
            want.push(format!(
                "{j}.properties[{p}].{x}: Forbidden: must be false to be structural"
            ));
        }
    }
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    assert_eq!(check_yaml(&schema), sorted(expect(&want)));
}

#[test]
fn upstream_embedded_resource_and_int_or_string_conflicts() {
    assert_eq!(
        check_yaml(
            "x-kubernetes-preserve-unknown-fields: true\nx-kubernetes-int-or-string: true\n"
        ),
        expect(&[
            ".x-kubernetes-preserve-unknown-fields: Invalid value: true: must be false if x-kubernetes-int-or-string is true"
        ])
    );
    assert_eq!(
        check_yaml(
            "type: object\nx-kubernetes-embedded-resource: true\nx-kubernetes-int-or-string: true\n"
        ),
        expect(&[
            ".properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
            ".x-kubernetes-embedded-resource: Invalid value: true: must be false if x-kubernetes-int-or-string is true",
        ])
    );
    assert_eq!(
        check_yaml(
            "type: array\nx-kubernetes-embedded-resource: true\nx-kubernetes-preserve-unknown-fields: true\n"
        ),
        expect(&[
            ".items: Required value: must be specified",
            ".type: Invalid value: \"array\": must be object at the root",
            ".type: Invalid value: \"array\": must be object if x-kubernetes-embedded-resource is true",
        ])
    );
    assert_eq!(
        check_yaml(
            "type: \"\"\nx-kubernetes-embedded-resource: true\nx-kubernetes-preserve-unknown-fields: true\n"
        ),
        expect(&[
            ".type: Required value: must be object if x-kubernetes-embedded-resource is true"
        ])
    );
    for ok in [
        "type: object\nx-kubernetes-embedded-resource: true\nx-kubernetes-preserve-unknown-fields: true\n",
        "type: object\nx-kubernetes-embedded-resource: true\nproperties:\n  apiVersion:\n    type: string\n  kind:\n    type: string\n  metadata:\n    type: object\n",
    ] {
        assert_eq!(check_yaml(ok), Vec::<String>::new(), "{ok}");
    }
    // validation_test.go: "x-kubernetes-embedded-resource with pruning and empty properties".
    assert_eq!(
        check_yaml(
            "
type: object
x-kubernetes-preserve-unknown-fields: true
properties:
  nil:
    type: object
    x-kubernetes-embedded-resource: true
  empty:
    type: object
    x-kubernetes-embedded-resource: true
    properties: {}
"
        ),
        expect(&[
            ".properties[empty].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
            ".properties[nil].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ])
    );
    // validation_test.go: "x-kubernetes-embedded-resource inside resource meta".
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  embedded:
    type: object
    x-kubernetes-embedded-resource: true
    properties:
      metadata:
        type: object
        x-kubernetes-embedded-resource: true
        x-kubernetes-preserve-unknown-fields: true
      apiVersion:
        type: string
        properties:
          foo:
            type: object
            x-kubernetes-embedded-resource: true
            x-kubernetes-preserve-unknown-fields: true
      kind:
        type: string
        properties:
          foo:
            type: object
            x-kubernetes-embedded-resource: true
            x-kubernetes-preserve-unknown-fields: true
"
        ),
        expect(&[
            ".properties[embedded].properties[apiVersion].properties[foo].x-kubernetes-embedded-resource: Forbidden: must not be used inside of resource meta",
            ".properties[embedded].properties[kind].properties[foo].x-kubernetes-embedded-resource: Forbidden: must not be used inside of resource meta",
            ".properties[embedded].properties[metadata].x-kubernetes-embedded-resource: Forbidden: must not be used inside of resource meta",
        ])
    );
    // validation_test.go: "additionalProperties at resource root".
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  embedded1:
    type: object
    x-kubernetes-embedded-resource: true
    additionalProperties:
      type: string
  embedded2:
    type: object
    x-kubernetes-embedded-resource: true
    x-kubernetes-preserve-unknown-fields: true
    additionalProperties:
      type: string
"
        ),
        expect(&[
            ".properties[embedded1].additionalProperties: Forbidden: must not be used if x-kubernetes-embedded-resource is set",
            ".properties[embedded1].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
            ".properties[embedded2].additionalProperties: Forbidden: must not be used if x-kubernetes-embedded-resource is set",
        ])
    );
}

#[test]
fn upstream_items_slices_and_regex() {
    assert_eq!(
        check_yaml(
            "type: object\nproperties:\n  slice:\n    type: array\n    items:\n    - type: string\n    - type: integer\n"
        ),
        expect(&[
            ".properties[slice].items: Forbidden: items must be a schema object and not an array"
        ])
    );
    assert_eq!(
        check_yaml(
            "type: object\nproperties:\n  slice:\n    type: array\n    items:\n      type: string\n    not:\n      items:\n      - type: string\n"
        ),
        expect(&[
            ".properties[slice].not.items: Forbidden: items must be a schema object and not an array"
        ])
    );
    assert_eq!(
        check_yaml("type: object\nproperties:\n  foo:\n    type: string\n    pattern: \"+\"\n"),
        expect(&[
            ".properties[foo].pattern: Invalid value: \"+\": must be a valid regular expression, but isn't: error parsing regexp: missing argument to repetition operator: `+`"
        ])
    );
    assert_eq!(
        check_yaml("type: object\nadditionalProperties: false\n"),
        expect(&[".additionalProperties: Forbidden: must not be used at the root"])
    );
}

#[test]
fn upstream_defaults_in_value_validation_are_forbidden() {
    // validation_test.go: "defaults in value validation with enabled feature gate".
    let got = check_yaml(
        "
type: object
properties:
  a:
    type: number
    not:
      default: 42.0
    anyOf:
    - default: 42.0
    allOf:
    - default: 42.0
    oneOf:
    - default: 42.0
",
    );
    assert_eq!(
        got,
        sorted(expect(&[
            ".properties[a].not.default: Forbidden: must be undefined to be structural",
            ".properties[a].allOf[0].default: Forbidden: must be undefined to be structural",
            ".properties[a].anyOf[0].default: Forbidden: must be undefined to be structural",
            ".properties[a].oneOf[0].default: Forbidden: must be undefined to be structural",
        ]))
    );
    assert_eq!(
        check_yaml("type: object\nproperties:\n  a:\n    type: number\n    default: 42.0\n"),
        Vec::<String>::new()
    );
}

#[test]
fn upstream_invalid_defaults() {
    // validation_test.go: "invalid defaults with enabled feature gate, structural schema".
    let got = check_yaml(
        "
type: object
properties:
  a:
    type: object
    properties:
      foo:
        type: string
    default:
      foo: abc
      bar: 42
  b:
    type: object
    properties:
      foo:
        type: string
    default:
      foo: abc
  c:
    type: object
    properties:
      foo:
        type: string
    default:
      foo: 42
  d:
    type: object
    properties:
      good:
        type: string
        pattern: a
      bad:
        type: string
        pattern: b
    default:
      good: a
      bad: a
  e:
    type: object
    x-kubernetes-preserve-unknown-fields: true
    properties:
      preserveUnknownFields:
        type: object
        default:
          foo: abc
          bar: 42
      nestedProperties:
        type: object
        properties:
          foo:
            type: string
        default:
          foo: abc
          bar: 42
  embedded-fine:
    type: object
    x-kubernetes-embedded-resource: true
    properties:
      foo:
        type: string
    default:
      foo: abc
      apiVersion: foo/v1
      kind: v1
      metadata:
        name: foo
  embedded-preserve:
    type: object
    x-kubernetes-embedded-resource: true
    x-kubernetes-preserve-unknown-fields: true
    properties:
      foo:
        type: string
    default:
      foo: abc
      apiVersion: foo/v1
      kind: v1
      metadata:
        name: foo
      bar: 42
  embedded-preserve-unpruned-objectmeta:
    type: object
    x-kubernetes-embedded-resource: true
    x-kubernetes-preserve-unknown-fields: true
    properties:
      foo:
        type: string
    default:
      foo: abc
      apiVersion: foo/v1
      kind: v1
      metadata:
        name: foo
        unspecified: bar
      bar: 42
",
    );
    assert_eq!(
        got,
        expect(&[
            ".properties[a].default: Invalid value: map[string]interface {}{\"bar\":42, \"foo\":\"abc\"}: must not have unknown fields",
            ".properties[c].default.foo: Invalid value: \"integer\": foo in body must be of type string: \"integer\"",
            ".properties[d].default.bad: Invalid value: \"a\": bad in body should match 'b'",
            ".properties[e].properties[nestedProperties].default: Invalid value: map[string]interface {}{\"bar\":42, \"foo\":\"abc\"}: must not have unknown fields",
            ".properties[e].properties[preserveUnknownFields].default: Invalid value: map[string]interface {}{\"bar\":42, \"foo\":\"abc\"}: must not have unknown fields",
        ])
    );
}

#[test]
fn upstream_metadata_defaults() {
    // validation_test.go: "v1.15 era tests for metadata defaults", one version each.
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  metadata:
    type: object
    default:
      name: foo
  embedded:
    type: object
    x-kubernetes-embedded-resource: true
    properties:
      metadata:
        type: object
        default:
          name: foo
          unknown: 42
"
        ),
        expect(&[
            ".properties[metadata].default: Forbidden: must not be set in top-level metadata"
        ])
    );
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  metadata:
    type: object
    properties:
      name:
        type: string
        default: foo
  embedded:
    type: object
    x-kubernetes-embedded-resource: true
    properties:
      apiVersion:
        type: string
        default: v1
      kind:
        type: string
        default: Pod
      metadata:
        type: object
        properties:
          name:
            type: string
            default: foo
"
        ),
        expect(&[
            ".properties[metadata].properties[name].default: Forbidden: must not be set in top-level metadata"
        ])
    );
    let label_msg = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
    let kind_msg = "may have mixed case, but should otherwise match: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  embedded:
    type: object
    x-kubernetes-embedded-resource: true
    properties:
      apiVersion:
        type: string
        default: v1
      kind:
        type: string
        default: \"%\"
      metadata:
        type: object
        default:
          labels:
            bar: x y
"
        ),
        [
            format!(
                "{ROOT}.properties[embedded].properties[kind].default: Invalid value: \"%\": must result in valid metadata: kind: Invalid value: \"%\": {kind_msg}"
            ),
            format!(
                "{ROOT}.properties[embedded].properties[metadata].default: Invalid value: map[string]interface {{}}{{\"labels\":map[string]interface {{}}{{\"bar\":\"x y\"}}}}: must result in valid metadata: metadata.labels: Invalid value: \"x y\": {label_msg}"
            ),
        ]
    );
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  embedded:
    type: object
    x-kubernetes-embedded-resource: true
    properties:
      metadata:
        type: object
        properties:
          name:
            type: string
            default: 42
          labels:
            type: object
            properties:
              bar:
                type: string
                default: 42
"
        ),
        [
            format!(
                "{ROOT}.properties[embedded].properties[metadata].properties[labels].properties[bar].default: Invalid value: 42: must result in valid metadata: metadata: Invalid value: map[string]interface {{}}{{\"labels\":map[string]interface {{}}{{\"bar\":42}}}}: json: cannot unmarshal number into Go struct field ObjectMeta.labels of type string"
            ),
            format!(
                "{ROOT}.properties[embedded].properties[metadata].properties[name].default: Invalid value: 42: must result in valid metadata: metadata: Invalid value: map[string]interface {{}}{{\"name\":42}}: json: cannot unmarshal number into Go struct field ObjectMeta.name of type string"
            ),
        ]
    );
    // validation_test.go: "default inside additionalSchema".
    assert_eq!(
        check_yaml(
            "
type: object
properties:
  embedded:
    type: object
    x-kubernetes-embedded-resource: true
    properties:
      metadata:
        type: object
        properties:
          annotations:
            type: object
            additionalProperties:
              type: string
              default: abc
"
        ),
        expect(&[
            ".properties[embedded].properties[metadata].properties[annotations].additionalProperties.default: Forbidden: must not be set inside additionalProperties applying to object metadata"
        ])
    );
}

fn noxu() -> Structural {
    structural(yaml(
        "
type: object
required: [alpha, beta]
properties:
  alpha:
    description: Alpha is an alphanumeric string with underscores
    type: string
    pattern: \"^[a-zA-Z0-9_]*$\"
  beta:
    description: Minimum value of beta is 10
    type: number
    minimum: 10
  gamma:
    description: Gamma is restricted to foo, bar and baz
    type: string
    enum: [foo, bar, baz]
",
    ))
}

fn noxu_instance() -> Value {
    json!({
        "apiVersion": "mygroup.example.com/v1beta1",
        "kind": "WishIHadChosenNoxu",
        "metadata": {"namespace": "not-the-default", "name": "foo"},
        "alpha": "foo_123",
        "beta": 10,
        "gamma": "bar",
        "delta": "hello",
    })
}

#[test]
fn upstream_custom_resource_validation_errors() {
    let s = noxu();
    assert_eq!(validate_cr(&s, noxu_instance()), Vec::<String>::new());
    let mut i = noxu_instance();
    i["alpha"] = json!("foo_123!");
    assert_eq!(
        validate_cr(&s, i),
        ["alpha: Invalid value: \"foo_123!\": alpha in body should match '^[a-zA-Z0-9_]*$'"]
    );
    let mut i = noxu_instance();
    i["beta"] = json!(5);
    assert_eq!(
        validate_cr(&s, i),
        ["beta: Invalid value: 5: beta in body should be greater than or equal to 10"]
    );
    let mut i = noxu_instance();
    i["gamma"] = json!("qux");
    assert_eq!(
        validate_cr(&s, i),
        ["gamma: Unsupported value: \"qux\": supported values: \"foo\", \"bar\", \"baz\""]
    );
    let mut i = noxu_instance();
    if let Some(o) = i.as_object_mut() {
        o.remove("alpha");
        o.remove("beta");
    }
    assert_eq!(validate_cr(&s, i), ["alpha: Required value", "beta: Required value"]);
}

#[test]
fn upstream_zero_value_validation() {
    let mut schema = json!({"type": "object", "properties": {}});
    let kinds = [
        ("string", json!({"type": "string"}), json!("")),
        ("boolean", json!({"type": "boolean"}), json!(false)),
        ("number", json!({"type": "number"}), json!(0.0)),
        ("integer", json!({"type": "integer"}), json!(0)),
        ("array", json!({"type": "array", "items": {"type": "string"}}), json!([])),
        ("object", json!({"type": "object", "properties": {"a": {"type": "string"}}}), json!({})),
    ];
    for (name, s, zero) in &kinds {
        let mut with_default = s.clone();
        with_default["default"] = zero.clone();
        let mut nullable = s.clone();
        nullable["nullable"] = json!(true);
        schema["properties"][*name] = s.clone();
        schema["properties"][format!("{name}_default")] = with_default;
        schema["properties"][format!("{name}_null")] = nullable;
    }
    let s = structural(schema);
    let mut cr = json!({
        "apiVersion": "tests.example.com/v1",
        "kind": "Zero",
        "metadata": {"name": "myzero"},
        "string": "", "string_null": null,
        "boolean": false, "boolean_null": null,
        "number": 0, "number_null": null,
        "integer": 0, "integer_null": null,
        "array": [], "array_null": null,
        "object": {}, "object_null": null,
    });
    assert_eq!(prune(&s, &mut cr), Vec::<String>::new());
    prune_non_nullable_nulls(&s, &mut cr);
    apply_defaults(&s, &mut cr);
    assert_eq!(validate_cr(&s, cr.clone()), Vec::<String>::new());
    for (name, _, zero) in &kinds {
        assert_eq!(cr[format!("{name}_default")], *zero, "{name}_default");
        assert_eq!(cr[format!("{name}_null")], Value::Null, "{name}_null");
    }
}

#[test]
fn accessors_for_server_side_apply() {
    let s = structural(json!({
        "type": "object",
        "properties": {
            "labels": {"type": "object", "x-kubernetes-map-type": "atomic", "additionalProperties": {"type": "string"}},
            "selector": {"type": "object", "x-kubernetes-map-type": "granular", "properties": {"a": {"type": "string"}}},
            "args": {"type": "array", "x-kubernetes-list-type": "atomic", "items": {"type": "string"}},
            "ports": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["port", "protocol"],
                "items": {"type": "object", "required": ["port", "protocol"], "properties": {
                    "port": {"type": "integer"}, "protocol": {"type": "string"}}},
            },
        },
    }));
    let labels = s.child("labels").expect("labels");
    assert_eq!(labels.map_type(), MapType::Atomic);
    // A map's values come from additionalProperties.
    assert_eq!(labels.child("any-key").map(|v| v.ty.as_str()), Some("string"));
    assert_eq!(
        labels
            .additional_properties
            .as_ref()
            .and_then(AdditionalProperties::schema)
            .map(|v| v.ty.as_str()),
        Some("string")
    );
    assert_eq!(s.child("selector").map(Structural::map_type), Some(MapType::Granular));
    assert_eq!(s.child("selector").and_then(|x| x.child("b")), None);
    assert_eq!(s.child("args").map(Structural::list_type), Some(ListType::Atomic));
    let ports = s.child("ports").expect("ports");
    assert_eq!(ports.list_type(), ListType::Map);
    assert_eq!(ports.list_map_keys(), ["port".to_string(), "protocol".to_string()]);
    assert_eq!(ports.items().and_then(|i| i.child("port")).map(|p| p.ty.as_str()), Some("integer"));
    assert_eq!(s.items(), None);
}

#[test]
fn enum_matching_converts_like_go() {
    // kube-openapi converts the value to the enum value's Go type before comparing.
    let s = structural(json!({
        "type": "object",
        "properties": {
            "i": {"type": "number", "enum": [2]},
            "f": {"type": "number", "enum": [2.0]},
            "n": {"type": "string", "nullable": true, "enum": ["a"]},
        },
    }));
    assert_eq!(validate_cr(&s, json!({"i": 2.5, "f": 2})), Vec::<String>::new());
    assert_eq!(
        validate_cr(&s, json!({"f": 2.5})),
        ["f: Unsupported value: 2.5: supported values: \"2\""]
    );
    // A null never matches an enum, even where nullable.
    assert_eq!(
        validate_cr(&s, json!({"n": null})),
        ["n: Unsupported value: null: supported values: \"a\""]
    );
}
