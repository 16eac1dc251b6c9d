//! Store throughput measurement, shared by `cargo xtask bench` and the ignored bench tests:
//! concurrent single-key creates through any [`Store`].

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{DynStore, Result, StoreExt};

/// The outcome of one [`creates`] run.
#[derive(Debug, Clone, Copy)]
pub struct CreateBench {
    pub callers: usize,
    pub creates: usize,
    pub elapsed: Duration,
}

impl CreateBench {
    pub fn per_second(&self) -> f64 {
        self.creates as f64 / self.elapsed.as_secs_f64()
    }
}

/// `callers` tasks each create `per_caller` keys `{prefix}{caller}/{i}` with a `value_size`-byte
/// value, one at a time (each waits for its acknowledgement before the next).
pub async fn creates(
    store: DynStore,
    prefix: &str,
    callers: usize,
    per_caller: usize,
    value_size: usize,
) -> Result<CreateBench> {
    let value = Bytes::from(vec![b'x'; value_size]);
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (store, value, prefix) = (store.clone(), value.clone(), prefix.to_owned());
            tokio::spawn(async move {
                for i in 0..per_caller {
                    store.create(&format!("{prefix}{caller}/{i}"), value.clone()).await?;
                }
                Ok::<_, super::Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.map_err(|e| super::Error::backend("bench task", e))??;
    }
    Ok(CreateBench { callers, creates: callers * per_caller, elapsed: started.elapsed() })
}
