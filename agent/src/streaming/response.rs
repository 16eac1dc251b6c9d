//! The body type of the agent's answers and its plain-text answer.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

pub(crate) fn text(code: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let mut msg = msg.into();
    if !msg.ends_with('\n') {
        msg.push('\n');
    }
    let mut resp = Response::new(Full::new(Bytes::from(msg)).map_err(|e| match e {}).boxed());
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
