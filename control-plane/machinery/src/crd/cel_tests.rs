//! Tests of the CEL rules: compilation at CRD time (errors, cost, transition rules), their
//! evaluation on custom resources (after the cases of upstream's
//! `pkg/apiserver/schema/cel/validation_test.go`), the Kubernetes libraries, and every rule
//! of the real CRDs under tests/fixtures/crds compiling.

use serde_json::{Value, json};

use super::Structural;
use crate::admission::FieldError;
use crate::admission::apiextensions::validate_custom;

fn schema(v: Value) -> Structural {
    Structural::from_value(&v).unwrap_or_else(|e| panic!("schema refused: {e:?}"))
}

fn schema_errors(v: Value) -> Vec<String> {
    Structural::from_value(&v).err().unwrap_or_default().iter().map(ToString::to_string).collect()
}

/// An object schema with `spec` of the given schema.
fn with_spec(spec: Value) -> Value {
    json!({"type": "object", "properties": {"spec": spec}})
}

fn causes(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(|e| format!("{} {}: {}", e.reason(), e.field, e.body())).collect()
}

fn check(s: &Structural, obj: Value, old: Option<Value>) -> Vec<String> {
    causes(&validate_custom(s, &obj, old.as_ref()))
}

/// Evaluates `rule` on `spec` (typed by `spec_schema`): the errors.
fn eval(spec_schema: Value, rule: &str, spec: Value) -> Vec<String> {
    let mut sch = spec_schema;
    sch["x-kubernetes-validations"] = json!([{"rule": rule}]);
    let s = schema(with_spec(sch));
    check(&s, json!({"spec": spec}), None)
}

fn passes(spec_schema: Value, rule: &str, spec: Value) {
    let errs = eval(spec_schema, rule, spec.clone());
    assert!(errs.is_empty(), "{rule} on {spec}: {errs:?}");
}

fn fails(spec_schema: Value, rule: &str, spec: Value) {
    let errs = eval(spec_schema, rule, spec.clone());
    assert_eq!(
        errs,
        [format!(
            "FieldValueInvalid spec: Invalid value: {:?}: failed rule: {rule}",
            spec_type(&spec)
        )],
        "{rule} on {spec}"
    );
}

fn spec_type(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() => "integer",
        _ => "number",
    }
}

fn obj(props: Value) -> Value {
    json!({"type": "object", "properties": props})
}

#[test]
fn scalars_are_typed_by_their_schema() {
    let s = obj(json!({
        "i": {"type": "integer"}, "n": {"type": "number"}, "s": {"type": "string"},
        "b": {"type": "boolean"}, "ios": {"x-kubernetes-int-or-string": true},
        "bytes": {"type": "string", "format": "byte"}
    }));
    let v = json!({"i": 3, "n": 2, "s": "abc", "b": true, "ios": 5, "bytes": "aGk="});
    passes(s.clone(), "self.i == 3 && self.i + 1 == 4", v.clone());
    passes(s.clone(), "self.n == 2.0 && type(self.n) == double", v.clone());
    passes(s.clone(), "type(self.i) == int", v.clone());
    passes(s.clone(), "self.s.size() == 3 && self.b", v.clone());
    passes(s.clone(), "self.ios == 5", v.clone());
    passes(s.clone(), "self.bytes == b'hi'", v.clone());
    passes(s.clone(), "self.ios == 'x'", json!({"ios": "x"}));
    fails(s, "self.i > 5", v);
}

#[test]
fn objects_maps_and_lists() {
    let s = obj(json!({
        "a": {"type": "string"},
        "m": {"type": "object", "additionalProperties": {"type": "integer"}},
        "l": {"type": "array", "maxItems": 10, "items": {"type": "integer"}},
        "objs": {"type": "array", "maxItems": 10, "items": obj(json!({"name": {"type": "string"}}))},
        "x-y": {"type": "string"},
        "namespace": {"type": "string"}
    }));
    let v = json!({"m": {"k1": 1, "k2": 2}, "l": [3, 1, 2], "objs": [{"name": "a"}, {"name": "b"}],
                   "x-y": "dash", "namespace": "ns"});
    passes(s.clone(), "!has(self.a) && has(self.m)", v.clone());
    passes(
        s.clone(),
        "self.m['k1'] == 1 && 'k2' in self.m && self.m.all(k, self.m[k] > 0)",
        v.clone(),
    );
    passes(s.clone(), "self.l.exists(x, x == 2) && self.l.exists_one(x, x > 2)", v.clone());
    passes(
        s.clone(),
        "self.l.map(x, x * 2) == [6, 2, 4] && self.l.filter(x, x > 1).size() == 2",
        v.clone(),
    );
    passes(s.clone(), "self.objs.all(o, o.name.size() == 1)", v.clone());
    passes(s.clone(), "self.x__dash__y == 'dash' && self.__namespace__ == 'ns'", v.clone());
    fails(s.clone(), "self.l.all(x, x > 1)", v.clone());
}

#[test]
fn rules_run_on_every_value_of_their_node_and_not_on_absent_ones() {
    let item = json!({"type": "object", "properties": {"v": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "self.v > 0", "message": "v must be positive"}]});
    let s = schema(with_spec(obj(json!({
        "items": {"type": "array", "maxItems": 5, "items": item},
        "opt": {"type": "object", "properties": {"v": {"type": "integer"}},
                "x-kubernetes-validations": [{"rule": "false"}]}
    }))));
    assert_eq!(
        check(&s, json!({"spec": {"items": [{"v": 1}, {"v": 0}, {"v": -1}]}}), None),
        [
            "FieldValueInvalid spec.items[1]: Invalid value: \"object\": v must be positive",
            "FieldValueInvalid spec.items[2]: Invalid value: \"object\": v must be positive",
        ]
    );
    assert!(check(&s, json!({"spec": {"items": []}}), None).is_empty());
}

#[test]
fn message_expression_reason_and_field_path() {
    let s = schema(with_spec(json!({
        "type": "object",
        "properties": {"replicas": {"type": "integer"}, "max": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "self.replicas <= self.max",
             "messageExpression": "'replicas ' + string(self.replicas) + ' over ' + string(self.max)",
             "fieldPath": ".replicas"},
            {"rule": "self.max < 100", "reason": "FieldValueForbidden", "message": "too many"},
            {"rule": "self.max != 42", "reason": "FieldValueRequired"},
            {"rule": "self.max != 43", "reason": "FieldValueDuplicate"},
            {"rule": "self.max != 44", "messageExpression": "1 / 0 == 1 ? 'x' : 'y'", "message": "fallback"}
        ]
    })));
    assert_eq!(
        check(&s, json!({"spec": {"replicas": 5, "max": 3}}), None),
        ["FieldValueInvalid spec.replicas: Invalid value: \"object\": replicas 5 over 3"]
    );
    assert_eq!(
        check(&s, json!({"spec": {"replicas": 1, "max": 100}}), None),
        ["FieldValueForbidden spec: Forbidden: too many"]
    );
    assert_eq!(
        check(&s, json!({"spec": {"replicas": 1, "max": 42}}), None),
        ["FieldValueRequired spec: Required value: failed rule: self.max != 42"]
    );
    assert_eq!(
        check(&s, json!({"spec": {"replicas": 1, "max": 43}}), None),
        ["FieldValueDuplicate spec: Duplicate value: \"object\""]
    );
    assert_eq!(
        check(&s, json!({"spec": {"replicas": 1, "max": 44}}), None),
        ["FieldValueInvalid spec: Invalid value: \"object\": fallback"]
    );
}

#[test]
fn transition_rules_see_the_correlated_old_value() {
    let s = schema(with_spec(obj(json!({
        "name": {"type": "string", "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "name is immutable"}]},
        "count": {"type": "integer", "x-kubernetes-validations": [
            {"rule": "!oldSelf.hasValue() || self >= oldSelf.value()", "optionalOldSelf": true,
             "message": "count may not decrease"}]},
        "ports": {"type": "array", "maxItems": 8, "x-kubernetes-list-type": "map",
                  "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "required": ["name"], "properties": {
                      "name": {"type": "string", "maxLength": 16},
                      "port": {"type": "integer", "x-kubernetes-validations": [
                          {"rule": "self == oldSelf", "message": "port is immutable"}]}}}}
    }))));
    let old = json!({"spec": {"name": "a", "count": 2, "ports": [{"name": "http", "port": 80}]}});
    // Create: transition rules do not run, except with optionalOldSelf.
    assert!(check(&s, json!({"spec": {"name": "b", "count": 1}}), None).is_empty());
    assert_eq!(
        check(
            &s,
            json!({"spec": {"name": "b", "count": 1, "ports": [
            {"name": "https", "port": 443}, {"name": "http", "port": 81}]}}),
            Some(old.clone())
        ),
        [
            "FieldValueInvalid spec.count: Invalid value: \"integer\": count may not decrease",
            "FieldValueInvalid spec.name: Invalid value: \"string\": name is immutable",
            "FieldValueInvalid spec.ports[1].port: Invalid value: \"integer\": port is immutable",
        ]
    );
    assert!(check(&s, old.clone(), Some(old)).is_empty());
}

#[test]
fn transition_rules_are_refused_where_old_values_do_not_correlate() {
    let errs = schema_errors(with_spec(obj(json!({
        "l": {"type": "array", "items": {"type": "string", "maxLength": 5,
              "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}
    }))));
    assert_eq!(
        errs,
        [
            "openAPIV3Schema.properties[spec].properties[l].items.x-kubernetes-validations[0].rule: Invalid value: \"self == oldSelf\": oldSelf cannot be used on the uncorrelatable portion of the schema within openAPIV3Schema.properties[spec].properties[l]"
        ]
    );
    let errs = schema_errors(with_spec(json!({"type": "string",
        "x-kubernetes-validations": [{"rule": "self == 'a'", "optionalOldSelf": true}]})));
    assert_eq!(
        errs,
        [
            "openAPIV3Schema.properties[spec].x-kubernetes-validations[0].optionalOldSelf: Invalid value: true: may not be set if oldSelf is not used in rule"
        ]
    );
}

#[test]
fn rules_that_do_not_compile_are_refused_with_cel_go_errors() {
    let rule_err = |rule: &str| -> String {
        let errs = schema_errors(with_spec(
            obj(json!({"a": {"type": "string"}}))
                .as_object()
                .map(|o| {
                    let mut o = o.clone();
                    o.insert("x-kubernetes-validations".into(), json!([{"rule": rule}]));
                    Value::Object(o)
                })
                .unwrap(),
        ));
        assert_eq!(errs.len(), 1, "{rule}: {errs:?}");
        errs[0].clone()
    };
    let e = rule_err("self.a ==");
    assert!(
        e.starts_with("openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: apiextensions.ValidationRule{Rule:\"self.a ==\"")
            && e.contains(": compilation failed: ERROR: <input>:1:"),
        "{e}"
    );
    let e = rule_err("foo == 1");
    assert!(e.contains("compilation failed: ERROR: <input>:1:1: undeclared reference to 'foo' (in container '')\n | foo == 1\n | ^"), "{e}");
    let e = rule_err("self.b == 'x'");
    assert!(
        e.contains("compilation failed: ERROR: <input>:1:") && e.contains("undefined field 'b'"),
        "{e}"
    );
    let e = rule_err("self.a.nosuchfn()");
    assert!(e.contains("undeclared reference to 'nosuchfn'"), "{e}");
    // messageExpression too.
    let errs = schema_errors(with_spec(json!({"type": "string",
        "x-kubernetes-validations": [{"rule": "true", "messageExpression": "'a' +"}]})));
    assert!(
        errs.len() == 1
            && errs[0].contains("x-kubernetes-validations[0].messageExpression: Invalid value: ")
            && errs[0].contains("messageExpression compilation failed: ERROR: <input>:1:"),
        "{errs:?}"
    );
}

#[test]
fn the_static_cost_estimate_refuses_unbounded_iteration() {
    // An unbounded list of unbounded strings, each scanned: upstream refuses it.
    let errs = schema_errors(with_spec(json!({"type": "array", "items": {"type": "string"},
        "x-kubernetes-validations": [{"rule": "self.all(x, x.contains('a'))"}]})));
    assert_eq!(
        errs,
        [
            "openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
            "openAPIV3Schema: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
        ]
    );
    // Bounded, it is accepted.
    assert!(
        schema_errors(with_spec(json!({"type": "array", "maxItems": 100,
        "items": {"type": "string", "maxLength": 63},
        "x-kubernetes-validations": [{"rule": "self.all(x, x.contains('a'))"}]})))
        .is_empty()
    );
    // Nested iteration multiplies.
    let errs = schema_errors(with_spec(json!({"type": "array", "maxItems": 5000,
        "items": {"type": "string", "maxLength": 63},
        "x-kubernetes-validations": [{"rule": "self.all(x, self.all(y, x == y || x != y))"}]})));
    assert!(
        errs.iter().any(|e| e.contains("estimated rule cost exceeds budget by factor of")),
        "{errs:?}"
    );
    // A rule under an unbounded list runs once per item.
    let errs = schema_errors(with_spec(json!({"type": "array",
        "items": {"type": "string", "maxLength": 4000,
                  "x-kubernetes-validations": [{"rule": "self.contains('a') && self.contains('b')"}]}})));
    assert!(
        errs.iter().any(|e| e.contains(
            "items.x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget"
        )),
        "{errs:?}"
    );
}

#[test]
fn the_runtime_budget_stops_validation() {
    // Each rule's estimate is within the per-rule limit, the two together within the CRD's,
    // but on a full list they use more than one request's budget: the second one stops.
    let rule = "self.all(x, self.all(y, x >= 0 || y >= 0))";
    let s =
        schema(with_spec(json!({"type": "array", "maxItems": 1000, "items": {"type": "integer"},
        "x-kubernetes-validations": [{"rule": rule}, {"rule": rule}]})));
    let full: Vec<i64> = (0..1000).collect();
    let errs = check(&s, json!({"spec": full}), None);
    assert_eq!(
        errs,
        [
            "FieldValueInvalid spec: Invalid value: \"array\": validation failed due to running out of cost budget, no further validation rules will be run"
        ],
    );
    let small = check(&s, json!({"spec": [1, 2, 3]}), None);
    assert!(small.is_empty(), "{small:?}");
}

#[test]
fn evaluation_errors_are_reported_like_upstream() {
    let s = obj(json!({"m": {"type": "object", "additionalProperties": {"type": "string"}}}));
    let errs = eval(s, "self.m['nope'] == 'x'", json!({"m": {}}));
    assert_eq!(
        errs,
        [
            "FieldValueInvalid spec: Invalid value: \"object\": no such key: nope evaluating rule: self.m['nope'] == 'x'"
        ]
    );
    let errs = eval(json!({"x-kubernetes-int-or-string": true}), "self > 1", json!("str"));
    assert_eq!(errs.len(), 1);
    assert!(errs[0].contains("call arguments did not match a supported operator, function or macro signature for rule: self > 1"), "{errs:?}");
}

#[test]
fn a_type_error_keeps_the_rules_from_running() {
    let s = schema(with_spec(
        json!({"type": "integer", "x-kubernetes-validations": [{"rule": "self > 1"}]}),
    ));
    let errs = check(&s, json!({"spec": "x"}), None);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[1].contains("some validation rules were not checked because the object was invalid"),
        "{errs:?}"
    );
}

#[test]
fn root_rules_see_api_version_kind_and_metadata_name() {
    let s = schema(json!({"type": "object",
        "properties": {"metadata": {"type": "object"}, "spec": {"type": "object"}},
        "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('ok-') && self.kind == 'Thing' && !has(self.metadata.labels)"}]}));
    assert!(check(&s, json!({"apiVersion": "x/v1", "kind": "Thing", "metadata": {"name": "ok-1", "labels": {"a": "b"}}}), None).is_empty());
    assert_eq!(
        check(&s, json!({"apiVersion": "x/v1", "kind": "Thing", "metadata": {"name": "no"}}), None)
            .len(),
        1
    );
}

#[test]
fn kubernetes_libraries() {
    let str_s = json!({"type": "string", "maxLength": 256});
    let cases = [
        // strings extension
        "'hello'.charAt(1) == 'e' && 'hello'.indexOf('l') == 2 && 'hello'.lastIndexOf('l') == 3",
        "'Hello'.lowerAscii() == 'hello' && 'Hello'.upperAscii() == 'HELLO' && ' x '.trim() == 'x'",
        "'a-b-c'.replace('-', '.') == 'a.b.c' && 'a,b'.split(',') == ['a', 'b'] && 'hello'.substring(1, 3) == 'el'",
        "['a', 'b'].join('-') == 'a-b' && 'abc'.startsWith('a') && 'abc'.endsWith('c') && 'abc'.contains('b')",
        "'abc'.matches('^a.c$')",
        // lists
        "[1, 2, 3].isSorted() && ![2, 1].isSorted() && [1, 2, 3].sum() == 6 && [3, 1, 2].min() == 1 && [3, 1, 2].max() == 3",
        "[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1",
        // regex
        "'abc 123 def 456'.find('[0-9]+') == '123' && 'abc 123 def 456'.findAll('[0-9]+') == ['123', '456'] && 'a1b2c3'.findAll('[0-9]', 2) == ['1', '2']",
        // urls
        "isURL('https://example.com:8443/a/b?x=1&x=2') && url('https://example.com:8443/a/b?x=1').getScheme() == 'https'",
        "url('https://example.com:8443/a/b').getHost() == 'example.com:8443' && url('https://example.com:8443/a').getHostname() == 'example.com' && url('https://example.com:8443/a').getPort() == '8443'",
        "url('https://[::1]:80/p').getHostname() == '::1' && url('https://e.com/a/b').getEscapedPath() == '/a/b' && url('https://e.com/?k=v&k=w').getQuery()['k'] == ['v', 'w'] && !isURL('not a url')",
        // ip / cidr
        "isIP('10.0.0.1') && !isIP('10.0.0.256') && ip('10.0.0.1').family() == 4 && ip('::1').family() == 6 && ip('127.0.0.1').isLoopback()",
        "ip('0.0.0.0').isUnspecified() && ip('169.254.1.1').isLinkLocalUnicast() && ip('8.8.8.8').isGlobalUnicast() && ip.isCanonical('::1') && !ip.isCanonical('::01')",
        "isCIDR('10.0.0.0/8') && cidr('10.0.0.0/8').containsIP(ip('10.1.2.3')) && cidr('10.0.0.0/8').containsIP('10.1.2.3') && !cidr('10.0.0.0/8').containsIP('11.0.0.1')",
        "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16') && cidr('10.1.2.3/8').masked() == cidr('10.0.0.0/8') && cidr('10.0.0.0/8').prefixLength() == 8 && cidr('10.0.0.0/8').ip() == ip('10.0.0.0')",
        // quantity
        "isQuantity('1Gi') && !isQuantity('1Gx') && quantity('1Gi').compareTo(quantity('1024Mi')) == 0 && quantity('500m').isLessThan(quantity('1'))",
        "quantity('2k').asInteger() == 2000 && quantity('1.5').isInteger() == false && quantity('1').add(quantity('500m')) == quantity('1500m') && quantity('1').sub(1).sign() == 0",
        "quantity('3').isGreaterThan(quantity('2')) && quantity('1e3').asApproximateFloat() == 1000.0",
        // sets
        "sets.contains([1, 2, 3], [1, 2]) && sets.equivalent([1, 2], [2, 1]) && sets.intersects([1], [1, 5]) && !sets.contains([1], [2])",
        // optionals and durations
        "optional.of(1).orValue(2) == 1 && optional.none().orValue(2) == 2",
        "duration('1h') > duration('30m')",
    ];
    for rule in cases {
        passes(str_s.clone(), rule, json!("x"));
    }
}

/// Every rule of the real CRDs under tests/fixtures/crds compiles, within the cost limits
/// (they install on upstream's apiserver).
#[test]
fn every_rule_of_the_fixture_crds_compiles() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/crds");
    let mut rules = 0;
    let mut failures = Vec::new();
    for project in std::fs::read_dir(&root).expect("fixtures") {
        let project = project.expect("entry").path();
        if !project.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&project).expect("project") {
            let file = file.expect("entry").path();
            if file.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("read");
            for doc in text.split("\n---\n") {
                if doc.trim().is_empty() || doc.trim() == "---" {
                    continue;
                }
                let crd: Value = serde_saphyr::from_str(doc).expect("yaml");
                for (i, v) in crd["spec"]["versions"].as_array().into_iter().flatten().enumerate() {
                    let schema = &v["schema"]["openAPIV3Schema"];
                    match Structural::from_value(schema) {
                        Ok(s) => rules += count(&s),
                        Err(errs) => failures.push(format!(
                            "{} versions[{i}]: {}",
                            file.display(),
                            errs.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  ")
                        )),
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "fixture rules that do not compile:\n{}", failures.join("\n"));
    assert!(rules > 200, "only {rules} rules found");
}

fn count(s: &Structural) -> usize {
    s.rules.compiled.len()
        + s.properties.values().map(count).sum::<usize>()
        + s.items().map_or(0, count)
        + s.additional_properties.as_ref().and_then(|a| a.schema()).map_or(0, count)
}
