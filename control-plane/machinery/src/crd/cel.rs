//! CEL validation rules of structural schemas (`x-kubernetes-validations`), with
//! upstream's semantics (`k8s.io/apiextensions-apiserver` `pkg/apiserver/schema/cel` and
//! `pkg/apis/apiextensions/validation` at Kubernetes v1.33): compiling each rule once per
//! CRD version ([`compile_tree`], whose results live in [`Structural::rules`]), the
//! CRD-time errors of those rules ([`rule_errors`]: compilation, cost, transition rules in
//! uncorrelatable places), and their evaluation on custom resources ([`validate_rules`]).
//!
//! Parsing and evaluation are the `cel` crate's (cel-rust). That crate has no type
//! checker, so the checks cel-go's checker makes at compile time that rules commonly trip
//! over are made here on the parsed expression ([`check`]): undeclared identifiers and
//! functions, and fields an object schema does not declare. Type mismatches the checker
//! would find are only found when the rule runs (as upstream finds them for
//! `x-kubernetes-int-or-string` and preserved unknown fields, which are dynamic there too).
//!
//! Cost: cel-rust does not meter evaluation, so both upstream budgets are checked against
//! this module's own estimate ([`estimate`]), computed once from the schema's bounds at
//! CRD time and, on requests, from the sizes of the actual values (see [`estimate`] for
//! what it counts).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, LazyLock};

use cel::common::ast::{Expr, IdedExpr};
use cel::objects::{Key, Map as CelMap, OptionalValue};
use cel::{Context, Env, ExecutionError, Program, Value as CelValue};
use serde_json::Value;

use super::cel_lib;
use super::schema::{AdditionalProperties, ListType, Structural};
use crate::admission::field::{Raw, go_quote};
use crate::admission::{FieldError, Path};

/// Upstream `StaticEstimatedCostLimit`: the largest estimated cost of one rule (times the
/// number of times it may run in one object).
pub const STATIC_ESTIMATED_COST_LIMIT: f64 = 10_000_000.0;
/// Upstream `StaticEstimatedCRDCostLimit`: the largest estimated cost of all the rules of
/// one CRD version's schema.
pub const STATIC_ESTIMATED_CRD_COST_LIMIT: f64 = 100_000_000.0;
/// Upstream `RuntimeCELCostBudget`: the cost all rules may use validating one object.
pub const RUNTIME_COST_BUDGET: f64 = 10_000_000.0;
/// Upstream's request size limit (`maxRequestSizeBytes`, 3 MiB), from which the size of an
/// unbounded list, map or string is derived when the schema gives no bound.
const MAX_REQUEST_SIZE_BYTES: f64 = 3.0 * 1024.0 * 1024.0;

/// The environment every rule compiles and runs in: the CEL standard library with its
/// macros, the strings extension, and the Kubernetes libraries ([`cel_lib`]).
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings).expect("strings extension registers");
    cel_lib::register(&mut env).expect("kubernetes libraries register");
    Arc::new(env)
});

/// The root scope rules are evaluated in: each evaluation binds `self` (and `oldSelf`) in a
/// child of it, so nothing is registered per request.
static ROOT: LazyLock<Context<'static, 'static>> = LazyLock::new(|| Context::with_env(ENV.clone()));

/// One `x-kubernetes-validations` entry, compiled.
pub struct CompiledRule {
    /// `rule`, as written.
    pub rule: String,
    /// `message` (empty when unset).
    pub message: String,
    /// `messageExpression`, as written (empty when unset).
    pub message_expression: String,
    /// `reason` (`FieldValueInvalid` when unset).
    pub reason: Option<String>,
    /// `fieldPath`, as written.
    pub field_path: String,
    /// `optionalOldSelf`, when set.
    pub optional_old_self: Option<bool>,
    /// The rule's program, or its compilation error (cel-go's wording).
    pub program: Result<Program, String>,
    /// The `messageExpression`'s program (`None` when unset), or its error.
    pub message_program: Option<Result<Program, String>>,
    /// The rule refers to `oldSelf`: a transition rule, run on updates only (unless
    /// `optionalOldSelf`).
    pub uses_old_self: bool,
    /// The estimated cost of one evaluation, from the schema's bounds.
    pub cost: f64,
    /// The estimated cost of one evaluation of the `messageExpression`.
    pub message_cost: f64,
}

impl fmt::Debug for CompiledRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledRule")
            .field("rule", &self.rule)
            .field("compiled", &self.program.is_ok())
            .finish()
    }
}

/// The compiled rules of one schema node, and whether a node below has any (so requests
/// walk only the parts of an object that have rules).
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub compiled: Vec<Arc<CompiledRule>>,
    pub below: bool,
}

impl PartialEq for Rules {
    /// Rules compare by their sources (the programs follow from them).
    fn eq(&self, other: &Self) -> bool {
        self.compiled.len() == other.compiled.len()
            && self.compiled.iter().zip(&other.compiled).all(|(a, b)| {
                a.rule == b.rule
                    && a.message == b.message
                    && a.message_expression == b.message_expression
                    && a.reason == b.reason
                    && a.field_path == b.field_path
                    && a.optional_old_self == b.optional_old_self
            })
    }
}

/// Compiles the rules of every node of `s` reachable through `properties`, `items` and
/// `additionalProperties` (the nodes values are validated against), and marks where rules
/// are. `root` is the CRD version's `openAPIV3Schema`: there and at embedded resources
/// `apiVersion`, `kind` and `metadata.name`/`metadata.generateName` are declared, as
/// upstream adds them to the rules' types.
pub fn compile_tree(s: &mut Structural) {
    compile_node(s, true, 1.0);
}

fn compile_node(s: &mut Structural, is_root: bool, cardinality: f64) -> bool {
    let mut below = false;
    for child in s.properties.values_mut() {
        below |= compile_node(child, false, cardinality);
    }
    let list_size = max_size(s);
    if let Some(items) = s.items.as_deref_mut() {
        below |= compile_node(items, false, cardinality * list_size);
    }
    if let Some(AdditionalProperties::Schema(ap)) = &mut s.additional_properties {
        below |= compile_node(ap, false, cardinality * list_size);
    }
    let compiled: Vec<Arc<CompiledRule>> = s
        .x_validations
        .iter()
        .filter_map(|r| r.as_object())
        .map(|r| Arc::new(compile(r, s, is_root || s.x_embedded_resource, cardinality)))
        .collect();
    let here = !compiled.is_empty();
    s.rules = Rules { compiled, below };
    here || below
}

fn str_field<'a>(r: &'a serde_json::Map<String, Value>, k: &str) -> &'a str {
    r.get(k).and_then(Value::as_str).unwrap_or_default()
}

/// Compiles one rule of node `s`.
fn compile(
    r: &serde_json::Map<String, Value>,
    s: &Structural,
    resource: bool,
    cardinality: f64,
) -> CompiledRule {
    let rule = str_field(r, "rule").to_string();
    let message_expression = str_field(r, "messageExpression").to_string();
    let scope = Scope::root(s, resource);
    let program = compile_expr(&rule, &scope);
    let uses_old_self = program.as_ref().is_ok_and(|p| refers_to(p.expression(), "oldSelf"));
    let cost = match &program {
        Ok(p) => estimate(p.expression(), &Shapes::schema(s, resource)) * cardinality,
        Err(_) => 0.0,
    };
    let message_program =
        (!message_expression.trim().is_empty()).then(|| compile_expr(&message_expression, &scope));
    let message_cost = match &message_program {
        Some(Ok(p)) => estimate(p.expression(), &Shapes::schema(s, resource)) * cardinality,
        _ => 0.0,
    };
    CompiledRule {
        rule,
        message: str_field(r, "message").to_string(),
        message_expression,
        reason: r.get("reason").and_then(Value::as_str).map(String::from),
        field_path: str_field(r, "fieldPath").to_string(),
        optional_old_self: r.get("optionalOldSelf").and_then(Value::as_bool),
        program,
        message_program,
        uses_old_self,
        cost,
        message_cost,
    }
}

fn compile_expr(source: &str, scope: &Scope<'_>) -> Result<Program, String> {
    let program = ENV.compile(source).map_err(|errs| {
        errs.errors
            .iter()
            .map(|e| cel_go_error(source, e.pos.0, e.pos.1, &e.msg))
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let mut errors = Vec::new();
    check(program.expression(), scope, &program, source, &mut errors);
    if errors.is_empty() { Ok(program) } else { Err(errors.join("\n")) }
}

/// An error as cel-go prints it: `ERROR: <input>:line:col: msg`, the line, and a caret
/// under the column.
fn cel_go_error(source: &str, line: isize, col: isize, msg: &str) -> String {
    let mut s = format!("ERROR: <input>:{line}:{col}: {msg}");
    if let Some(text) = source.lines().nth((line - 1).max(0) as usize) {
        s.push_str("\n | ");
        s.push_str(text);
        s.push_str("\n | ");
        for _ in 1..col.max(1) {
            s.push('.');
        }
        s.push('^');
    }
    s
}

/// The 1-based line and column of an expression node.
fn position(program: &Program, source: &str, id: u64) -> (isize, isize) {
    let Some((start, _)) = program.source_info().offset_for(id) else {
        return (1, 1);
    };
    let start = start as usize;
    let (mut line, mut col) = (1, 1);
    for (i, c) in source.char_indices() {
        if i >= start {
            break;
        }
        if c == '\n' {
            line += 1;
            col = 1;
        } else {
            col += 1;
        }
    }
    (line, col)
}

fn refers_to(e: &IdedExpr, name: &str) -> bool {
    let mut found = false;
    visit(e, &mut |e| {
        if let Expr::Ident(n) = &e.expr {
            found |= n == name;
        }
    });
    found
}

fn visit(e: &IdedExpr, f: &mut dyn FnMut(&IdedExpr)) {
    f(e);
    match &e.expr {
        Expr::Call(c) => {
            if let Some(t) = &c.target {
                visit(t, f);
            }
            c.args.iter().for_each(|a| visit(a, f));
        }
        Expr::Comprehension(c) => {
            for x in [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                visit(x, f);
            }
        }
        Expr::List(l) => l.elements.iter().for_each(|a| visit(a, f)),
        Expr::Map(m) => m.entries.iter().for_each(|en| {
            if let cel::common::ast::EntryExpr::MapEntry(me) = &en.expr {
                visit(&me.key, f);
                visit(&me.value, f);
            }
        }),
        Expr::Select(s) => visit(&s.operand, f),
        Expr::Struct(s) => s.entries.iter().for_each(|en| {
            if let cel::common::ast::EntryExpr::StructField(sf) = &en.expr {
                visit(&sf.value, f);
            }
        }),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

// ---------------------------------------------------------------------------------------
// Compile-time checks

/// What a name in a rule stands for, to the checker: a value described by a schema node
/// (`self`, `oldSelf`, the variables of macros over them), or a value of unknown shape.
#[derive(Clone, Copy)]
enum Decl<'a> {
    Schema(&'a Structural, bool),
    Dynamic,
}

struct Scope<'a> {
    vars: Vec<(String, Decl<'a>)>,
}

impl<'a> Scope<'a> {
    fn root(s: &'a Structural, resource: bool) -> Self {
        Self {
            vars: vec![
                ("self".into(), Decl::Schema(s, resource)),
                ("oldSelf".into(), Decl::Schema(s, resource)),
            ],
        }
    }

    fn get(&self, name: &str) -> Option<Decl<'a>> {
        self.vars.iter().rev().find(|(n, _)| n == name).map(|(_, d)| *d)
    }
}

/// Identifiers that name types or constants of the standard environment.
const TYPE_NAMES: [&str; 12] = [
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
    "optional_type",
];

/// Upstream's checker errors that rules commonly trip over: undeclared references
/// (identifiers and functions the environment does not declare) and fields a schema does
/// not declare (`undefined field 'x'`).
fn check(
    e: &IdedExpr,
    scope: &Scope<'_>,
    program: &Program,
    source: &str,
    errors: &mut Vec<String>,
) {
    let err = |errors: &mut Vec<String>, id: u64, msg: String| {
        let (l, c) = position(program, source, id);
        errors.push(cel_go_error(source, l, c, &msg));
    };
    match &e.expr {
        Expr::Ident(name) => {
            if scope.get(name).is_none() && !TYPE_NAMES.contains(&name.as_str()) {
                err(errors, e.id, format!("undeclared reference to '{name}' (in container '')"));
            }
        }
        Expr::Select(sel) => {
            if let Expr::Ident(ns) = &sel.operand.expr
                && scope.get(ns).is_none()
                && cel_lib::is_namespace(ns)
            {
                return;
            }
            check(&sel.operand, scope, program, source, errors);
            if let Some(Decl::Schema(s, resource)) = decl_of(&sel.operand, scope)
                && declares_fields(s, resource)
                && field_schema(s, resource, &sel.field).is_none()
            {
                err(errors, e.id, format!("undefined field '{}'", sel.field));
            }
        }
        Expr::Call(call) => {
            let name = call.func_name.as_str();
            let qualified = match call.target.as_deref().map(|t| &t.expr) {
                Some(Expr::Ident(ns)) if scope.get(ns).is_none() && cel_lib::is_namespace(ns) => {
                    Some(format!("{ns}.{name}"))
                }
                _ => None,
            };
            if let Some(q) = &qualified {
                if !cel_lib::is_function(q) {
                    err(errors, e.id, format!("undeclared reference to '{q}' (in container '')"));
                }
            } else {
                if let Some(t) = &call.target {
                    check(t, scope, program, source, errors);
                }
                if !is_operator(name) && !cel_lib::is_function(name) {
                    err(
                        errors,
                        e.id,
                        format!("undeclared reference to '{name}' (in container '')"),
                    );
                }
            }
            for a in &call.args {
                check(a, scope, program, source, errors);
            }
        }
        Expr::Comprehension(c) => {
            check(&c.iter_range, scope, program, source, errors);
            check(&c.accu_init, scope, program, source, errors);
            let elem = match decl_of(&c.iter_range, scope) {
                Some(Decl::Schema(s, _)) if s.ty == "array" => {
                    s.items().map_or(Decl::Dynamic, |i| Decl::Schema(i, i.x_embedded_resource))
                }
                _ => Decl::Dynamic,
            };
            let mut inner = Scope { vars: scope.vars.clone() };
            inner.vars.push((c.accu_var.clone(), Decl::Dynamic));
            match &c.iter_var2 {
                Some(v2) => {
                    inner.vars.push((c.iter_var.clone(), Decl::Dynamic));
                    inner.vars.push((v2.clone(), elem));
                }
                None => inner.vars.push((c.iter_var.clone(), elem)),
            }
            for x in [&c.loop_cond, &c.loop_step, &c.result] {
                check(x, &inner, program, source, errors);
            }
        }
        _ => {
            // Literals and literal collections: check what they contain.
            let mut children = Vec::new();
            match &e.expr {
                Expr::List(l) => children.extend(l.elements.iter()),
                Expr::Map(m) => {
                    for en in &m.entries {
                        if let cel::common::ast::EntryExpr::MapEntry(me) = &en.expr {
                            children.push(&me.key);
                            children.push(&me.value);
                        }
                    }
                }
                Expr::Struct(s) => {
                    for en in &s.entries {
                        if let cel::common::ast::EntryExpr::StructField(sf) = &en.expr {
                            children.push(&sf.value);
                        }
                    }
                }
                _ => {}
            }
            for c in children {
                check(c, scope, program, source, errors);
            }
        }
    }
}

/// Operators and the calls macros expand to (`_&&_`, `@in`, `@not_strictly_false`, ...).
fn is_operator(name: &str) -> bool {
    name.starts_with('_') || name.starts_with('@') || name.starts_with('!') || name.starts_with('-')
}

/// The schema of the value an expression selects from `self`/`oldSelf` (and macro
/// variables), when it is a chain of field selections, index operations and macros'
/// variables.
fn decl_of<'a>(e: &IdedExpr, scope: &Scope<'a>) -> Option<Decl<'a>> {
    match &e.expr {
        Expr::Ident(n) => scope.get(n),
        Expr::Select(sel) if !sel.test => match decl_of(&sel.operand, scope)? {
            Decl::Schema(s, resource) => {
                field_schema(s, resource, &sel.field).map(|(c, r)| Decl::Schema(c, r))
            }
            Decl::Dynamic => None,
        },
        _ => None,
    }
}

/// Whether the fields of an object with this schema are declared (an object with
/// `properties` only, not a map or preserved unknown fields): selecting another is a
/// compile error.
fn declares_fields(s: &Structural, resource: bool) -> bool {
    s.ty == "object"
        && (!s.properties.is_empty() || resource)
        && s.additional_properties.is_none()
        && !s.x_preserve_unknown_fields
}

/// The schema of field `field` (as CEL spells it, escaped) of an object with schema `s`.
/// `resource`: `s` is a resource (the root, or embedded), with `apiVersion`, `kind` and
/// `metadata` (of which `name` and `generateName`).
fn field_schema<'a>(
    s: &'a Structural,
    resource: bool,
    field: &str,
) -> Option<(&'a Structural, bool)> {
    if s.additional_properties.is_some() && s.properties.is_empty() {
        return s.additional_properties.as_ref().and_then(|a| a.schema()).map(|c| (c, false));
    }
    for (name, child) in &s.properties {
        if escape(name).as_deref() == Some(field) {
            return Some((child, child.x_embedded_resource));
        }
    }
    if resource && matches!(field, "apiVersion" | "kind" | "metadata") {
        return Some((&RESOURCE_FIELD, false));
    }
    None
}

/// The schema the implicit `apiVersion`, `kind` and `metadata` fields of a resource are
/// checked against: none (dynamic).
static RESOURCE_FIELD: LazyLock<Structural> = LazyLock::new(Structural::default);

/// CEL's reserved words, which a property name is escaped from (`__name__`).
const RESERVED: [&str; 20] = [
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
];

/// A property name as rules spell it (upstream `cel.Escape`): reserved words as
/// `__word__`, `__` as `__underscores__`, `.` `-` `/` as `__dot__` `__dash__` `__slash__`;
/// `None` when the result is still not an identifier (the property cannot be selected).
pub fn escape(name: &str) -> Option<String> {
    if RESERVED.contains(&name) || name == "while" {
        return Some(format!("__{name}__"));
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("__") {
            out.push_str("__underscores__");
            rest = &rest[2..];
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c if c.is_ascii_alphanumeric() || c == '_' => out.push(c),
            _ => return None,
        }
        rest = &rest[c.len_utf8()..];
    }
    let first = out.chars().next()?;
    (first.is_ascii_alphabetic() || first == '_').then_some(out)
}

// ---------------------------------------------------------------------------------------
// Cost

/// The shape of a value, as the estimator sees it: the schema it is described by, the
/// actual values it may be (on requests), or only its largest size.
#[derive(Clone)]
enum Shape<'a> {
    Schema(&'a Structural, bool),
    Values(Vec<&'a Value>),
    Sized(f64),
}

/// The shapes `self` and `oldSelf` have.
struct Shapes<'a> {
    vars: Vec<(String, Shape<'a>)>,
}

impl<'a> Shapes<'a> {
    fn schema(s: &'a Structural, resource: bool) -> Self {
        let sh = Shape::Schema(s, resource);
        Self { vars: vec![("self".into(), sh.clone()), ("oldSelf".into(), sh)] }
    }

    fn values(new: &'a Value, old: Option<&'a Value>) -> Self {
        let mut vars = vec![("self".into(), Shape::Values(vec![new]))];
        if let Some(o) = old {
            vars.push(("oldSelf".into(), Shape::Values(vec![o])));
        }
        Self { vars }
    }

    fn get(&self, n: &str) -> Shape<'a> {
        self.vars.iter().rev().find(|(v, _)| v == n).map_or(Shape::Sized(1.0), |(_, s)| s.clone())
    }
}

/// The smallest size of a value of this schema in JSON (upstream derives the number of
/// items a list without `maxItems` may have from the request size and this).
fn min_serialized_size(s: &Structural) -> f64 {
    match s.ty.as_str() {
        "string" => 2.0,
        "boolean" => 4.0,
        "integer" | "number" => 1.0,
        "array" | "object" => 2.0,
        _ => 1.0,
    }
}

/// The largest size (items, properties, characters) of a value of schema `s`: its
/// `maxItems`/`maxProperties`/`maxLength`, or what fits in a request.
fn max_size(s: &Structural) -> f64 {
    let v = &s.validation;
    match s.ty.as_str() {
        "array" => v.max_items.map(|m| m as f64).unwrap_or_else(|| {
            let item = s.items().map_or(1.0, min_serialized_size);
            ((MAX_REQUEST_SIZE_BYTES - 2.0) / (item + 1.0)).floor()
        }),
        "object" => v.max_properties.map(|m| m as f64).unwrap_or_else(|| {
            if s.additional_properties.is_none() && !s.x_preserve_unknown_fields {
                return s.properties.len().max(1) as f64;
            }
            let value = s.additional_properties.as_ref().and_then(|a| a.schema());
            // `"":v,` at the least.
            let entry = 4.0 + value.map_or(1.0, min_serialized_size);
            ((MAX_REQUEST_SIZE_BYTES - 2.0) / entry).floor()
        }),
        "string" => v.max_length.map(|m| m as f64).unwrap_or(MAX_REQUEST_SIZE_BYTES - 2.0),
        "" if s.x_preserve_unknown_fields || s.x_int_or_string => MAX_REQUEST_SIZE_BYTES - 2.0,
        _ => 1.0,
    }
}

fn json_size(v: &Value) -> f64 {
    match v {
        Value::String(s) => s.chars().count() as f64,
        Value::Array(a) => a.len() as f64,
        Value::Object(o) => o.len() as f64,
        _ => 1.0,
    }
}

impl<'a> Shape<'a> {
    fn size(&self) -> f64 {
        match self {
            Shape::Schema(s, _) => max_size(s),
            Shape::Values(vs) => vs.iter().map(|v| json_size(v)).fold(0.0, f64::max),
            Shape::Sized(n) => *n,
        }
    }

    fn field(&self, f: &str) -> Shape<'a> {
        match self {
            Shape::Schema(s, r) => match field_schema(s, *r, f) {
                Some((c, r)) => Shape::Schema(c, r),
                None => Shape::Sized(1.0),
            },
            Shape::Values(vs) => Shape::Values(
                vs.iter().filter_map(|v| v.get(f).or_else(|| v.get(unescape(f)))).collect(),
            ),
            Shape::Sized(_) => Shape::Sized(1.0),
        }
    }

    /// The shape of the elements a macro iterates over (a list's items, a map's keys).
    fn elements(&self) -> Shape<'a> {
        match self {
            Shape::Schema(s, _) if s.ty == "array" => {
                s.items().map_or(Shape::Sized(1.0), |i| Shape::Schema(i, i.x_embedded_resource))
            }
            Shape::Schema(s, _) if s.ty == "object" => Shape::Sized(MAX_REQUEST_SIZE_BYTES),
            Shape::Schema(..) => Shape::Sized(1.0),
            Shape::Values(vs) => {
                let mut out = Vec::new();
                let mut key_len: f64 = 0.0;
                for v in vs {
                    match v {
                        Value::Array(a) => out.extend(a.iter()),
                        Value::Object(o) => {
                            for k in o.keys() {
                                key_len = key_len.max(k.chars().count() as f64);
                            }
                        }
                        _ => {}
                    }
                }
                if out.is_empty() { Shape::Sized(key_len.max(1.0)) } else { Shape::Values(out) }
            }
            Shape::Sized(_) => Shape::Sized(1.0),
        }
    }

    /// The shape of `x[i]`: a list's items, a map's values.
    fn index(&self) -> Shape<'a> {
        match self {
            Shape::Schema(s, _) if s.ty == "object" => {
                match s.additional_properties.as_ref().and_then(|a| a.schema()) {
                    Some(c) => Shape::Schema(c, c.x_embedded_resource),
                    None => Shape::Sized(1.0),
                }
            }
            Shape::Values(vs) => Shape::Values(
                vs.iter()
                    .flat_map(|v| match v {
                        Value::Array(a) => a.iter().collect::<Vec<_>>(),
                        Value::Object(o) => o.values().collect(),
                        _ => Vec::new(),
                    })
                    .collect(),
            ),
            other => other.elements(),
        }
    }
}

/// Undoes [`escape`] for the common cases, to look a field up in a JSON object.
fn unescape(f: &str) -> String {
    if f.starts_with("__") && f.ends_with("__") && RESERVED.contains(&&f[2..f.len() - 2]) {
        return f[2..f.len() - 2].to_string();
    }
    f.replace("__underscores__", "__")
        .replace("__dot__", ".")
        .replace("__dash__", "-")
        .replace("__slash__", "/")
}

/// Functions whose cost grows with the size of their receiver or first argument (string
/// scans, list scans): cel-go charges 0.1 per character or element traversed.
const TRAVERSING: [&str; 27] = [
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "split",
    "replace",
    "lowerAscii",
    "upperAscii",
    "trim",
    "substring",
    "indexOf",
    "lastIndexOf",
    "find",
    "findAll",
    "join",
    "isSorted",
    "sum",
    "min",
    "max",
    "url",
    "isURL",
    "ip",
    "isIP",
    "cidr",
    "isCIDR",
    "quantity",
    "isQuantity",
];

/// An estimate of the cost of evaluating `e`, after cel-go's cost model but simpler: 1 per
/// identifier, field selection and call, 10 per list or map literal, 0.1 per character or
/// element a string or list function traverses (its receiver's or first argument's size),
/// `==`/`!=`/`+` and `in` on collections by their size, and a macro's body times the
/// number of elements it iterates over (the schema's `maxItems`/`maxProperties`, or what
/// fits in a request without; the actual number on requests). Nested macros multiply.
/// Regular expressions are charged by the string's length only.
fn estimate(e: &IdedExpr, shapes: &Shapes<'_>) -> f64 {
    estimate_shape(e, shapes).0
}

fn estimate_shape<'a>(e: &IdedExpr, shapes: &Shapes<'a>) -> (f64, Shape<'a>) {
    match &e.expr {
        Expr::Literal(_) | Expr::Unspecified => (0.0, Shape::Sized(1.0)),
        Expr::Ident(n) => (1.0, shapes.get(n)),
        Expr::Select(sel) => {
            let (c, sh) = estimate_shape(&sel.operand, shapes);
            if sel.test { (c + 1.0, Shape::Sized(1.0)) } else { (c + 1.0, sh.field(&sel.field)) }
        }
        Expr::List(l) => {
            let c: f64 = l.elements.iter().map(|x| estimate(x, shapes)).sum();
            (c + 10.0, Shape::Sized(l.elements.len() as f64))
        }
        Expr::Map(_) | Expr::Struct(_) => {
            let mut c = 10.0;
            visit_children(e, &mut |x| c += estimate(x, shapes));
            (c, Shape::Sized(1.0))
        }
        Expr::Call(call) => {
            let mut cost = 1.0;
            let mut first: Option<Shape<'a>> = None;
            if let Some(t) = &call.target {
                let (c, sh) = estimate_shape(t, shapes);
                cost += c;
                first = Some(sh);
            }
            let mut arg_shapes = Vec::new();
            for a in &call.args {
                let (c, sh) = estimate_shape(a, shapes);
                cost += c;
                arg_shapes.push(sh);
            }
            let name = call.func_name.as_str();
            let recv = first.clone().or_else(|| arg_shapes.first().cloned());
            let recv_size = recv.as_ref().map_or(1.0, Shape::size);
            let result = match name {
                "_[_]" => {
                    return (cost, arg_shapes.first().map_or(Shape::Sized(1.0), Shape::index));
                }
                "_==_" | "_!=_" | "_+_" | "_<_" | "_>_" | "_<=_" | "_>=_" => {
                    let other = arg_shapes.get(1).map_or(1.0, Shape::size);
                    cost += 0.1 * recv_size.min(other.max(1.0)).max(1.0);
                    if name == "_+_" {
                        return (cost, Shape::Sized(recv_size + other));
                    }
                    Shape::Sized(1.0)
                }
                "@in" => {
                    cost += arg_shapes.get(1).map_or(1.0, Shape::size);
                    Shape::Sized(1.0)
                }
                n if TRAVERSING.contains(&n) => {
                    cost += 0.1 * recv_size;
                    Shape::Sized(recv_size)
                }
                _ => Shape::Sized(1.0),
            };
            (cost, result)
        }
        Expr::Comprehension(c) => {
            let (range_cost, range) = estimate_shape(&c.iter_range, shapes);
            let n = range.size();
            let mut inner = Shapes { vars: shapes.vars.clone() };
            inner.vars.push((c.accu_var.clone(), Shape::Sized(n)));
            inner.vars.push((c.iter_var.clone(), range.elements()));
            if let Some(v2) = &c.iter_var2 {
                inner.vars.push((v2.clone(), range.index()));
            }
            let body = estimate(&c.loop_cond, &inner) + estimate(&c.loop_step, &inner);
            let total = range_cost
                + estimate(&c.accu_init, shapes)
                + n * body
                + estimate(&c.result, &inner);
            (total, Shape::Sized(n))
        }
    }
}

fn visit_children(e: &IdedExpr, f: &mut dyn FnMut(&IdedExpr)) {
    let mut first = true;
    visit(e, &mut |x| {
        if first {
            first = false;
        } else {
            f(x)
        }
    });
}

/// `exceeds budget by factor of ...`, upstream's wording.
fn cost_error(what: &str, cost: f64, limit: f64) -> String {
    let factor = cost / limit;
    let factor = if factor > 100.0 {
        "more than 100x".to_string()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{what} exceeds budget by factor of {factor} (try simplifying the rule, or adding \
         maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

// ---------------------------------------------------------------------------------------
// CRD-time errors

/// The errors of the compiled rules under `s` (a parsed `openAPIV3Schema` at `path`),
/// upstream's CEL errors of `ValidateCustomResourceDefinitionOpenAPISchema`: compilation
/// (`compilation failed: ...`), per-rule cost (`estimated rule cost exceeds budget ...`),
/// `oldSelf` where old values cannot be correlated, `optionalOldSelf` without `oldSelf`,
/// and the cost of all the rules together.
pub fn rule_errors(s: &Structural, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0.0;
    node_errors(s, path, None, &mut total, &mut errs);
    if total > STATIC_ESTIMATED_CRD_COST_LIMIT {
        errs.push(FieldError::forbidden(
            path,
            cost_error(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                total,
                STATIC_ESTIMATED_CRD_COST_LIMIT,
            ),
        ));
    }
    errs
}

fn node_errors(
    s: &Structural,
    path: &Path,
    uncorrelatable: Option<&Path>,
    total: &mut f64,
    errs: &mut Vec<FieldError>,
) {
    for (i, r) in s.rules.compiled.iter().enumerate() {
        let rp = path.child("x-kubernetes-validations").index(i);
        if r.cost > STATIC_ESTIMATED_COST_LIMIT {
            errs.push(FieldError::forbidden(
                &rp.child("rule"),
                cost_error("estimated rule cost", r.cost, STATIC_ESTIMATED_COST_LIMIT),
            ));
        }
        *total += r.cost + r.message_cost;
        if let Err(e) = &r.program {
            errs.push(FieldError::invalid(
                &rp.child("rule"),
                go_rule(r),
                format!("compilation failed: {e}"),
            ));
        }
        match &r.message_program {
            Some(Err(e)) => errs.push(FieldError::invalid(
                &rp.child("messageExpression"),
                go_rule(r),
                format!("messageExpression compilation failed: {e}"),
            )),
            Some(Ok(_)) if r.message_cost > STATIC_ESTIMATED_COST_LIMIT => {
                errs.push(FieldError::forbidden(
                    &rp.child("messageExpression"),
                    cost_error(
                        "estimated messageExpression cost",
                        r.message_cost,
                        STATIC_ESTIMATED_COST_LIMIT,
                    ),
                ))
            }
            _ => {}
        }
        if r.uses_old_self {
            if let Some(u) = uncorrelatable {
                errs.push(FieldError::invalid(
                    &rp.child("rule"),
                    &r.rule,
                    format!("oldSelf cannot be used on the uncorrelatable portion of the schema within {u}"),
                ));
            }
        } else if r.optional_old_self.is_some() && r.program.is_ok() {
            errs.push(FieldError::invalid(
                &rp.child("optionalOldSelf"),
                r.optional_old_self.unwrap_or_default(),
                "may not be set if oldSelf is not used in rule",
            ));
        }
    }
    if !s.rules.below {
        return;
    }
    for (name, c) in &s.properties {
        node_errors(c, &path.child("properties").key(name), uncorrelatable, total, errs);
    }
    if let Some(items) = s.items() {
        let unc = if s.list_type() == ListType::Map { uncorrelatable } else { Some(path) };
        node_errors(items, &path.child("items"), unc, total, errs);
    }
    if let Some(AdditionalProperties::Schema(ap)) = &s.additional_properties {
        node_errors(ap, &path.child("additionalProperties"), uncorrelatable, total, errs);
    }
}

/// A rule as upstream prints it as a bad value (Go's `%#v` of `apiextensions.ValidationRule`).
fn go_rule(r: &CompiledRule) -> Raw {
    let reason = match &r.reason {
        Some(_) => "(*apiextensions.FieldValueErrorReason)(0xc000000000)",
        None => "(*apiextensions.FieldValueErrorReason)(nil)",
    };
    let old = match r.optional_old_self {
        Some(_) => "(*bool)(0xc000000000)",
        None => "(*bool)(nil)",
    };
    Raw(format!(
        "apiextensions.ValidationRule{{Rule:{}, Message:{}, MessageExpression:{}, Reason:{reason}, FieldPath:{}, OptionalOldSelf:{old}}}",
        go_quote(&r.rule),
        go_quote(&r.message),
        go_quote(&r.message_expression),
        go_quote(&r.field_path),
    ))
}

// ---------------------------------------------------------------------------------------
// Request time

/// The remaining runtime budget of one request's validation.
struct Budget(f64);

/// Evaluates the rules of `schema` on the custom resource `new` (and `old`, on update),
/// appending upstream's field errors to `errs`: for each node with rules, each value at
/// that node (absent and null values are not evaluated) is bound to `self`, typed per its
/// schema, and for transition rules the correlated old value to `oldSelf` (through object
/// fields, map keys and `x-kubernetes-list-type: map` items by key). Stops, with
/// upstream's error, when the runtime cost budget runs out.
pub fn validate_rules(
    schema: &Structural,
    new: &Value,
    old: Option<&Value>,
    errs: &mut Vec<FieldError>,
) {
    let mut budget = Budget(RUNTIME_COST_BUDGET);
    let _ = walk(schema, true, new, old, &Path::root(""), &mut budget, errs);
}

/// `Err(())`: the budget ran out, no further rules run.
fn walk(
    s: &Structural,
    resource: bool,
    new: &Value,
    old: Option<&Value>,
    path: &Path,
    budget: &mut Budget,
    errs: &mut Vec<FieldError>,
) -> Result<(), ()> {
    if new.is_null() {
        return Ok(());
    }
    if !s.rules.compiled.is_empty() {
        evaluate(s, resource, new, old, path, budget, errs)?;
    }
    if !s.rules.below {
        return Ok(());
    }
    match new {
        Value::Object(m) => {
            for (k, v) in m {
                let (child, embedded) = match s.properties.get(k) {
                    Some(c) => (c, c.x_embedded_resource),
                    None => match s.additional_properties.as_ref().and_then(|a| a.schema()) {
                        Some(c) => (c, c.x_embedded_resource),
                        None => continue,
                    },
                };
                let o = old.and_then(|o| o.get(k));
                walk(child, embedded, v, o, &path.child(k), budget, errs)?;
            }
        }
        Value::Array(items) => {
            let Some(is) = s.items() else { return Ok(()) };
            let keys = s.list_map_keys();
            let olds: Option<&Vec<Value>> = old.and_then(Value::as_array);
            for (i, v) in items.iter().enumerate() {
                let o = match (s.list_type(), olds) {
                    (ListType::Map, Some(olds)) => {
                        olds.iter().find(|o| keys.iter().all(|k| o.get(k) == v.get(k)))
                    }
                    _ => None,
                };
                walk(is, is.x_embedded_resource, v, o, &path.index(i), budget, errs)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn evaluate(
    s: &Structural,
    resource: bool,
    new: &Value,
    old: Option<&Value>,
    path: &Path,
    budget: &mut Budget,
    errs: &mut Vec<FieldError>,
) -> Result<(), ()> {
    let ty = if s.ty.is_empty() { "" } else { s.ty.as_str() };
    let self_value = to_cel(new, Some(s), resource);
    let old_value = old.map(|o| to_cel(o, Some(s), resource));
    let out_of_budget = |errs: &mut Vec<FieldError>| {
        errs.push(FieldError::invalid(
            path,
            ty,
            "validation failed due to running out of cost budget, no further validation rules will be run",
        ));
    };
    for r in &s.rules.compiled {
        let Ok(program) = &r.program else { continue };
        let optional = r.optional_old_self == Some(true);
        if r.uses_old_self && old.is_none() && !optional {
            continue;
        }
        budget.0 -= estimate(program.expression(), &Shapes::values(new, old));
        if budget.0 < 0.0 {
            out_of_budget(errs);
            return Err(());
        }
        let mut ctx = ROOT.new_inner_scope();
        ctx.add_variable_from_value("self", self_value.clone());
        if optional {
            let opt = match &old_value {
                Some(o) => OptionalValue::of(o.clone()),
                None => OptionalValue::none(),
            };
            ctx.add_variable_from_value("oldSelf", CelValue::Opaque(Arc::new(opt)));
        } else if let Some(o) = &old_value {
            ctx.add_variable_from_value("oldSelf", o.clone());
        }
        let detail = |r: &CompiledRule| -> String {
            if r.message.trim().is_empty() {
                format!("failed rule: {}", r.rule.trim())
            } else {
                r.message.trim().to_string()
            }
        };
        match program.execute(&ctx) {
            Ok(CelValue::Bool(true)) => {}
            Ok(CelValue::Bool(false)) => {
                let at = with_field_path(path, &r.field_path);
                let mut message = detail(r);
                if let Some(Ok(mp)) = &r.message_program {
                    budget.0 -= estimate(mp.expression(), &Shapes::values(new, old));
                    if budget.0 < 0.0 {
                        out_of_budget(errs);
                        return Err(());
                    }
                    if let Ok(CelValue::String(m)) = mp.execute(&ctx)
                        && !m.trim().is_empty()
                        && !m.contains(['\n', '\r'])
                    {
                        message = m.to_string();
                    }
                }
                errs.push(match r.reason.as_deref() {
                    Some("FieldValueForbidden") => FieldError::forbidden(&at, message),
                    Some("FieldValueRequired") => FieldError::required(&at, message),
                    Some("FieldValueDuplicate") => FieldError::duplicate(&at, ty),
                    _ => FieldError::invalid(&at, ty, message),
                });
            }
            Ok(other) => errs.push(FieldError::invalid(
                path,
                ty,
                format!(
                    "rule evaluated to {other:?}, not a bool, evaluating rule: {}",
                    rule_string(r)
                ),
            )),
            Err(e) => errs.push(eval_error(path, ty, &e, r)),
        }
    }
    Ok(())
}

fn rule_string(r: &CompiledRule) -> &str {
    if r.message.trim().is_empty() { r.rule.trim() } else { r.message.trim() }
}

/// An evaluation error, worded as upstream's validator words cel-go's.
fn eval_error(path: &Path, ty: &str, e: &ExecutionError, r: &CompiledRule) -> FieldError {
    match e {
        ExecutionError::NoSuchOverload(_) => FieldError::invalid(
            path,
            ty,
            format!(
                "'no such overload': call arguments did not match a supported operator, function or macro signature for rule: {}",
                rule_string(r)
            ),
        ),
        ExecutionError::NoSuchKey(k) => FieldError::invalid(
            path,
            ty,
            format!("no such key: {k} evaluating rule: {}", rule_string(r)),
        ),
        other => FieldError::invalid(
            path,
            ty,
            format!("{} evaluating rule: {}", lower_first(&other.to_string()), rule_string(r)),
        ),
    }
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

/// `path` with a rule's `fieldPath` (`.spec.x`, `x['y']`, `x[0]`) appended.
fn with_field_path(path: &Path, field_path: &str) -> Path {
    let mut p = path.clone();
    let mut rest = field_path.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            rest = r;
            continue;
        }
        if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").unwrap_or(r.len());
            p = p.child(&r[..end]);
            rest = r.get(end + 2..).unwrap_or_default();
            continue;
        }
        if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').unwrap_or(r.len());
            match r[..end].parse::<usize>() {
                Ok(i) => p = p.index(i),
                Err(_) => p = p.key(&r[..end]),
            }
            rest = r.get(end + 1..).unwrap_or_default();
            continue;
        }
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        p = p.child(&rest[..end]);
        rest = &rest[end..];
    }
    p
}

/// A JSON value as a CEL value of the type its schema gives it (upstream's
/// `UnstructuredToVal`): `integer` as `int`, `number` as `double`, int-or-string as `int`
/// or `string`, `format: byte` strings as `bytes`, objects with `properties` as maps keyed
/// by their escaped property names (a resource's `metadata` with only `name` and
/// `generateName`), maps (`additionalProperties`) by their keys, and values without a
/// schema (preserved unknown fields) by their JSON type (integral numbers as `int`).
pub(crate) fn to_cel(v: &Value, s: Option<&Structural>, resource: bool) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match s.map(|s| s.ty.as_str()) {
            Some("number") => CelValue::Float(n.as_f64().unwrap_or_default()),
            Some("integer") => match n.as_i64() {
                Some(i) => CelValue::Int(i),
                None => CelValue::Float(n.as_f64().unwrap_or_default()),
            },
            _ => match n.as_i64() {
                Some(i) => CelValue::Int(i),
                None => CelValue::Float(n.as_f64().unwrap_or_default()),
            },
        },
        Value::String(st) => {
            if let Some(s) = s
                && s.ty == "string"
                && s.format == "byte"
            {
                use base64::Engine as _;
                if let Ok(b) = base64::engine::general_purpose::STANDARD.decode(st) {
                    return CelValue::Bytes(Arc::new(b));
                }
            }
            CelValue::String(Arc::new(st.clone()))
        }
        Value::Array(a) => {
            let items = s.and_then(Structural::items);
            CelValue::List(Arc::new(
                a.iter()
                    .map(|x| to_cel(x, items, items.is_some_and(|i| i.x_embedded_resource)))
                    .collect(),
            ))
        }
        Value::Object(o) => {
            let mut map: HashMap<Key, CelValue> = HashMap::with_capacity(o.len());
            let structured = s.is_some_and(|s| !s.properties.is_empty());
            for (k, x) in o {
                if resource && k == "metadata" {
                    let mut meta = BTreeMap::new();
                    for f in ["name", "generateName"] {
                        if let Some(Value::String(n)) = x.get(f) {
                            meta.insert(f, n.clone());
                        }
                    }
                    let meta: HashMap<Key, CelValue> = meta
                        .into_iter()
                        .map(|(f, n)| {
                            (Key::String(Arc::new(f.into())), CelValue::String(Arc::new(n)))
                        })
                        .collect();
                    map.insert(
                        Key::String(Arc::new(k.clone())),
                        CelValue::Map(CelMap { map: Arc::new(meta) }),
                    );
                    continue;
                }
                let child = s.and_then(|s| s.child(k));
                let key = if structured && s.is_some_and(|s| s.properties.contains_key(k)) {
                    match escape(k) {
                        Some(e) => e,
                        None => continue,
                    }
                } else {
                    k.clone()
                };
                let embedded = child.is_some_and(|c| c.x_embedded_resource);
                map.insert(Key::String(Arc::new(key)), to_cel(x, child, embedded));
            }
            CelValue::Map(CelMap { map: Arc::new(map) })
        }
    }
}
