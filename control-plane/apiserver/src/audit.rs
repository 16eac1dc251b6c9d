//! The audit log: one audit.k8s.io/v1 `Event` per request as a JSON line (stage
//! ResponseComplete) with who (user, source IPs, user agent), what (verb, requestURI,
//! objectRef) and the outcome (responseStatus), at a level chosen by `--audit-level`:
//! None, Metadata, Request (adds requestObject) or RequestResponse (adds responseObject).
//! Upstream's rule-based policy file is not supported: one level applies to every request.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, Method};
use serde_json::{Map, Value, json};

use super::request::{self, Query, Route};
use super::user::UserInfo;

/// How much of a request is recorded (upstream `audit.Level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Level {
    None,
    #[default]
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

impl std::str::FromStr for Level {
    type Err = Error;
    fn from_str(s: &str) -> Result<Level, Error> {
        match s {
            "None" => Ok(Level::None),
            "Metadata" => Ok(Level::Metadata),
            "Request" => Ok(Level::Request),
            "RequestResponse" => Ok(Level::RequestResponse),
            other => Err(Error::Level { level: other.to_string() }),
        }
    }
}

/// `--audit-log-path` (none: no audit log) and `--audit-level`.
#[derive(Debug, Clone, Default)]
pub struct AuditConfig {
    pub path: Option<PathBuf>,
    pub level: Level,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown audit level {level:?} (None, Metadata, Request, RequestResponse)")]
    Level { level: String },
    #[error("opening the audit log {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The remote address of a connection, put in each request's extensions by the server.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// An open audit log.
pub struct AuditLog {
    level: Level,
    out: Mutex<std::io::LineWriter<std::fs::File>>,
}

/// Largest request body buffered for the log (larger ones are refused later anyway).
const BODY_CAP: usize = 64 * 1024 * 1024;

impl AuditLog {
    /// Open (append) the log of `config`; `None` when auditing is off.
    pub fn open(config: &AuditConfig) -> Result<Option<AuditLog>, Error> {
        let Some(path) = &config.path else { return Ok(None) };
        if config.level == Level::None {
            return Ok(None);
        }
        let file =
            open_append(path).map_err(|source| Error::Open { path: path.clone(), source })?;
        Ok(Some(AuditLog { level: config.level, out: Mutex::new(std::io::LineWriter::new(file)) }))
    }

    /// Start the record of a request: what is known before it is served.
    pub fn begin(&self, req: &Request, user: &UserInfo) -> Record<'_> {
        let uri = req.uri();
        let query = Query::parse(uri.query());
        let (verb, object_ref) = match request::parse(req.method(), uri.path(), query.flag("watch"))
        {
            Ok(Some(Route::Resource(info))) => {
                let mut r = Map::new();
                r.insert("resource".into(), json!(info.resource));
                if let Some(ns) = &info.namespace {
                    r.insert("namespace".into(), json!(ns));
                }
                if let Some(n) = &info.name {
                    r.insert("name".into(), json!(n));
                }
                r.insert("apiGroup".into(), json!(info.group));
                r.insert("apiVersion".into(), json!(info.version));
                if let Some(s) = &info.subresource {
                    r.insert("subresource".into(), json!(s));
                }
                (info.verb.as_str().to_string(), Some(Value::Object(r)))
            }
            _ => (req.method().as_str().to_lowercase(), None),
        };
        let mut source_ips: Vec<String> = req
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        if let Some(PeerAddr(peer)) = req.extensions().get::<PeerAddr>() {
            let ip = peer.ip().to_string();
            if !source_ips.contains(&ip) {
                source_ips.push(ip);
            }
        }
        let mut user_json = json!({"username": user.name, "groups": user.groups});
        if !user.uid.is_empty() {
            user_json["uid"] = json!(user.uid);
        }
        if !user.extra.is_empty() {
            user_json["extra"] = json!(user.extra);
        }
        let mut event = json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": self.level.as_str(),
            "auditID": uuid::Uuid::new_v4().to_string(),
            "stage": "ResponseComplete",
            "requestURI": uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"),
            "verb": verb,
            "user": user_json,
            "sourceIPs": source_ips,
            "requestReceivedTimestamp": micro_time(),
        });
        if let Some(ua) = req.headers().get(http::header::USER_AGENT).and_then(|v| v.to_str().ok())
        {
            event["userAgent"] = json!(ua);
        }
        if let Some(r) = object_ref {
            event["objectRef"] = r;
        }
        // A watch is recorded when its response starts (it may last half an hour).
        let watch = verb == "watch";
        if watch {
            event["stage"] = json!("ResponseStarted");
        }
        Record { log: self, event, watch }
    }

    fn write(&self, event: &Value) {
        let mut line = event.to_string();
        line.push('\n');
        let mut out = match self.out.lock() {
            Ok(o) => o,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Err(e) = out.write_all(line.as_bytes()) {
            tracing::warn!(error = %e, "writing the audit log");
        }
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

/// upstream MicroTime: RFC 3339 with microseconds.
fn micro_time() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// One request being audited.
pub struct Record<'a> {
    log: &'a AuditLog,
    event: Value,
    watch: bool,
}

impl Record<'_> {
    /// The request's audit ID (also sent as the `Audit-Id` response header).
    pub fn id(&self) -> String {
        self.event["auditID"].as_str().unwrap_or_default().to_string()
    }

    /// At level Request and above, keep a copy of the request body; the request is rebuilt
    /// with the buffered body. An unreadable body is answered by the caller.
    pub async fn capture_request(&mut self, req: Request) -> Result<Request, Response> {
        if self.log.level < Level::Request || matches!(*req.method(), Method::GET | Method::HEAD) {
            return Ok(req);
        }
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, BODY_CAP).await {
            Ok(b) => b,
            Err(_) => {
                return Err(axum::response::IntoResponse::into_response(
                    super::status::ApiError::too_large(super::negotiate::MAX_BODY),
                ));
            }
        };
        use super::negotiate::{self, BodyType};
        let decoded = match negotiate::body_type(&parts.headers) {
            Ok(t @ (BodyType::Protobuf | BodyType::Yaml)) => {
                negotiate::decode_object(t, &bytes).ok()
            }
            _ => serde_json::from_slice::<Value>(&bytes).ok(),
        };
        if let Some(v) = decoded {
            self.event["requestObject"] = v;
        }
        Ok(Request::from_parts(parts, Body::from(bytes)))
    }

    /// Complete the record with the response and write it; returns the response (rebuilt
    /// when its body was read).
    pub async fn finish(mut self, response: Response) -> Response {
        let code = response.status().as_u16();
        let is_json = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/json"));
        let want_body =
            !self.watch && is_json && (code >= 400 || self.log.level == Level::RequestResponse);
        let mut status = json!({"metadata": {}, "code": code});
        let response = if want_body {
            let (parts, body) = response.into_parts();
            let bytes =
                axum::body::to_bytes(body, usize::MAX).await.unwrap_or_else(|_| Bytes::new());
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                if code >= 400 {
                    for k in ["status", "message", "reason"] {
                        if let Some(x) =
                            v.get(k).filter(|x| x.as_str().is_some_and(|s| !s.is_empty()))
                        {
                            status[k] = x.clone();
                        }
                    }
                }
                if self.log.level == Level::RequestResponse {
                    self.event["responseObject"] = v;
                }
            }
            Response::from_parts(parts, Body::from(bytes))
        } else {
            response
        };
        self.event["responseStatus"] = status;
        self.event["stageTimestamp"] = json!(micro_time());
        let mut response = response;
        if let Ok(id) = HeaderValue::from_str(&self.id()) {
            response.headers_mut().insert("audit-id", id);
        }
        self.log.write(&self.event);
        response
    }
}
