//! placeholder

use std::sync::Arc;

use super::Context;

pub async fn run(_ctx: Arc<Context>) {}
