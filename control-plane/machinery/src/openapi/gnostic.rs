//! The gnostic `openapi.v2.Document` protobuf encoding of the Swagger 2.0 document
//! (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`), which kubectl 1.27/1.28
//! fetch for `apply`, `create -f` and `explain`.
//!
//! The prost messages below are the subset of gnostic's `openapiv2/OpenAPIv2.proto` that the
//! document uses, with gnostic's field numbers. Vendor extensions (`x-kubernetes-*`) travel
//! as `NamedAny { name, value: Any { yaml } }`, their value rendered as YAML, which is how
//! kubectl reads the group-version-kind and the patch merge keys.

use serde_json::Value;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(string, repeated, tag = "5")]
    pub schemes: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    pub consumes: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub produces: Vec<String>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
    #[prost(message, repeated, tag = "12")]
    pub security: Vec<SecurityRequirement>,
    #[prost(message, repeated, tag = "16")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(string, tag = "3")]
    pub description: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    /// google.protobuf.Any value = 1 (unused).
    #[prost(string, tag = "2")]
    pub yaml: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StringArray {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedStringArray {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<StringArray>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecurityRequirement {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedStringArray>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "1")]
    pub vendor_extension: Vec<NamedAny>,
    #[prost(message, repeated, tag = "2")]
    pub path: Vec<NamedPathItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedPathItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<PathItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PathItem {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(message, optional, tag = "2")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "3")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "4")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "6")]
    pub options: Option<Operation>,
    #[prost(message, optional, tag = "7")]
    pub head: Option<Operation>,
    #[prost(message, optional, tag = "8")]
    pub patch: Option<Operation>,
    #[prost(message, repeated, tag = "9")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, repeated, tag = "10")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Operation {
    #[prost(string, repeated, tag = "1")]
    pub tags: Vec<String>,
    #[prost(string, tag = "2")]
    pub summary: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "5")]
    pub operation_id: String,
    #[prost(string, repeated, tag = "6")]
    pub produces: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub consumes: Vec<String>,
    #[prost(message, repeated, tag = "8")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, optional, tag = "9")]
    pub responses: Option<Responses>,
    #[prost(string, repeated, tag = "10")]
    pub schemes: Vec<String>,
    #[prost(bool, tag = "11")]
    pub deprecated: bool,
    #[prost(message, repeated, tag = "13")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ParametersItem {
    #[prost(oneof = "parameters_item::Oneof", tags = "1, 2")]
    pub oneof: Option<parameters_item::Oneof>,
}

pub mod parameters_item {
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Parameter(super::Parameter),
        #[prost(message, tag = "2")]
        JsonReference(super::JsonReference),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct JsonReference {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub description: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Parameter {
    #[prost(oneof = "parameter::Oneof", tags = "1, 2")]
    pub oneof: Option<parameter::Oneof>,
}

pub mod parameter {
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        BodyParameter(super::BodyParameter),
        #[prost(message, tag = "2")]
        NonBodyParameter(super::NonBodyParameter),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyParameter {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub r#in: String,
    #[prost(bool, tag = "4")]
    pub required: bool,
    #[prost(message, optional, tag = "5")]
    pub schema: Option<Schema>,
    #[prost(message, repeated, tag = "6")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NonBodyParameter {
    #[prost(oneof = "non_body_parameter::Oneof", tags = "3, 4")]
    pub oneof: Option<non_body_parameter::Oneof>,
}

pub mod non_body_parameter {
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "3")]
        QueryParameterSubSchema(super::QueryParameterSubSchema),
        #[prost(message, tag = "4")]
        PathParameterSubSchema(super::PathParameterSubSchema),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryParameterSubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "6")]
    pub r#type: String,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PathParameterSubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub r#type: String,
    #[prost(bool, tag = "19")]
    pub unique_items: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "1")]
    pub response_code: Vec<NamedResponseValue>,
    #[prost(message, repeated, tag = "2")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedResponseValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseValue {
    #[prost(oneof = "response_value::Oneof", tags = "1")]
    pub oneof: Option<response_value::Oneof>,
}

pub mod response_value {
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Response(super::Response),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "2")]
    pub schema: Option<SchemaItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SchemaItem {
    #[prost(oneof = "schema_item::Oneof", tags = "1")]
    pub oneof: Option<schema_item::Oneof>,
}

pub mod schema_item {
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Schema(super::Schema),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Schema {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, optional, boxed, tag = "21")]
    pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AdditionalPropertiesItem {
    #[prost(oneof = "additional_properties_item::Oneof", tags = "1, 2")]
    pub oneof: Option<additional_properties_item::Oneof>,
}

pub mod additional_properties_item {
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Schema(super::Schema),
        #[prost(bool, tag = "2")]
        Boolean(bool),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

/// Encode a Swagger 2.0 document (as the JSON the apiserver also serves) as gnostic protobuf.
pub fn encode_document(v2: &Value) -> Vec<u8> {
    prost::Message::encode_to_vec(&document(v2))
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// The `x-*` keys of an object as gnostic vendor extensions (YAML-encoded values).
fn vendor_extensions(v: &Value) -> Vec<NamedAny> {
    v.as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("x-"))
        .map(|(k, value)| NamedAny {
            name: k.clone(),
            value: Some(Any { yaml: serde_saphyr::to_string(value).unwrap_or_default() }),
        })
        .collect()
}

/// Builds the gnostic document from the Swagger JSON.
pub fn document(v2: &Value) -> Document {
    let paths = v2
        .get("paths")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, item)| NamedPathItem { name: name.clone(), value: Some(path_item(item)) })
        .collect();
    let definitions = v2
        .get("definitions")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, s)| NamedSchema { name: name.clone(), value: Some(schema(s)) })
        .collect();
    let security = v2
        .get("security")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|req| SecurityRequirement {
            additional_properties: req
                .as_object()
                .into_iter()
                .flatten()
                .map(|(name, scopes)| NamedStringArray {
                    name: name.clone(),
                    value: Some(StringArray {
                        value: scopes
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|s| s.as_str().map(str::to_string))
                            .collect(),
                    }),
                })
                .collect(),
        })
        .collect();
    Document {
        swagger: text(v2, "swagger"),
        info: v2.get("info").map(|i| Info {
            title: text(i, "title"),
            version: text(i, "version"),
            description: text(i, "description"),
        }),
        schemes: strings(v2, "schemes"),
        consumes: strings(v2, "consumes"),
        produces: strings(v2, "produces"),
        paths: Some(Paths { vendor_extension: vec![], path: paths }),
        definitions: Some(Definitions { additional_properties: definitions }),
        security,
        vendor_extension: vendor_extensions(v2),
    }
}

fn path_item(v: &Value) -> PathItem {
    let op = |m: &str| v.get(m).map(operation);
    PathItem {
        r#ref: text(v, "$ref"),
        get: op("get"),
        put: op("put"),
        post: op("post"),
        delete: op("delete"),
        options: op("options"),
        head: op("head"),
        patch: op("patch"),
        parameters: parameters(v),
        vendor_extension: vendor_extensions(v),
    }
}

fn parameters(v: &Value) -> Vec<ParametersItem> {
    v.get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            let required = p.get("required").and_then(Value::as_bool).unwrap_or(false);
            let unique_items = p.get("uniqueItems").and_then(Value::as_bool).unwrap_or(false);
            let param = match p.get("in").and_then(Value::as_str) {
                Some("body") => parameter::Oneof::BodyParameter(BodyParameter {
                    description: text(p, "description"),
                    name: text(p, "name"),
                    r#in: "body".into(),
                    required,
                    schema: p.get("schema").map(schema),
                    vendor_extension: vendor_extensions(p),
                }),
                Some("path") => parameter::Oneof::NonBodyParameter(NonBodyParameter {
                    oneof: Some(non_body_parameter::Oneof::PathParameterSubSchema(
                        PathParameterSubSchema {
                            required,
                            r#in: "path".into(),
                            description: text(p, "description"),
                            name: text(p, "name"),
                            r#type: text(p, "type"),
                            unique_items,
                        },
                    )),
                }),
                _ => parameter::Oneof::NonBodyParameter(NonBodyParameter {
                    oneof: Some(non_body_parameter::Oneof::QueryParameterSubSchema(
                        QueryParameterSubSchema {
                            required,
                            r#in: "query".into(),
                            description: text(p, "description"),
                            name: text(p, "name"),
                            r#type: text(p, "type"),
                            unique_items,
                        },
                    )),
                }),
            };
            ParametersItem {
                oneof: Some(parameters_item::Oneof::Parameter(Parameter { oneof: Some(param) })),
            }
        })
        .collect()
}

fn operation(v: &Value) -> Operation {
    let responses = v
        .get("responses")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(code, r)| NamedResponseValue {
            name: code.clone(),
            value: Some(ResponseValue {
                oneof: Some(response_value::Oneof::Response(Response {
                    description: text(r, "description"),
                    schema: r
                        .get("schema")
                        .map(|s| SchemaItem { oneof: Some(schema_item::Oneof::Schema(schema(s))) }),
                })),
            }),
        })
        .collect();
    Operation {
        tags: strings(v, "tags"),
        summary: text(v, "summary"),
        description: text(v, "description"),
        operation_id: text(v, "operationId"),
        produces: strings(v, "produces"),
        consumes: strings(v, "consumes"),
        parameters: parameters(v),
        responses: Some(Responses { response_code: responses, vendor_extension: vec![] }),
        schemes: strings(v, "schemes"),
        deprecated: v.get("deprecated").and_then(Value::as_bool).unwrap_or(false),
        vendor_extension: vendor_extensions(v),
    }
}

fn schema(v: &Value) -> Schema {
    let named = |key: &str| -> Vec<NamedSchema> {
        v.get(key)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(name, s)| NamedSchema { name: name.clone(), value: Some(schema(s)) })
            .collect()
    };
    let properties = named("properties");
    Schema {
        r#ref: text(v, "$ref"),
        format: text(v, "format"),
        title: text(v, "title"),
        description: text(v, "description"),
        unique_items: v.get("uniqueItems").and_then(Value::as_bool).unwrap_or(false),
        required: strings(v, "required"),
        additional_properties: v.get("additionalProperties").map(|a| {
            Box::new(AdditionalPropertiesItem {
                oneof: Some(match a {
                    Value::Bool(b) => additional_properties_item::Oneof::Boolean(*b),
                    s => additional_properties_item::Oneof::Schema(schema(s)),
                }),
            })
        }),
        r#type: v.get("type").map(|t| TypeItem {
            value: match t {
                Value::Array(a) => {
                    a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()
                }
                Value::String(s) => vec![s.clone()],
                _ => vec![],
            },
        }),
        items: v.get("items").map(|i| ItemsItem {
            schema: match i {
                Value::Array(a) => a.iter().map(schema).collect(),
                s => vec![schema(s)],
            },
        }),
        all_of: v
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(schema)
            .collect(),
        properties: (!properties.is_empty())
            .then_some(Properties { additional_properties: properties }),
        vendor_extension: vendor_extensions(v),
    }
}
