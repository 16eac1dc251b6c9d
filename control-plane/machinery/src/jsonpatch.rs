//! RFC 6902 JSON patches with kube-apiserver's bounds, checked before the work they would
//! cost: at most [`MAX_OPERATIONS`] operations, and `copy` operations that together add at
//! most [`MAX_COPY_BYTES`] (each copy can double the document: 21 copies of 1 KiB made
//! gigabytes). Operations are applied by the `json-patch` crate, one at a time, each copy's
//! size measured first without building it.

use std::io::Write;

use json_patch::{PatchOperation, patch_unsafe};
use serde_json::Value;

/// Upstream's `maxJSONPatchOperations`.
pub const MAX_OPERATIONS: usize = 10_000;
/// Upstream's `JSONPatchMaxCopyBytes` (3 MiB, the request body limit).
pub const MAX_COPY_BYTES: usize = 3 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Too many operations: upstream answers 413.
    #[error("The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {0}")]
    TooManyOperations(usize),
    /// Not a JSON patch (an array of operations).
    #[error("{0}")]
    Decode(#[source] serde_json::Error),
    /// The copies would grow the document past [`MAX_COPY_BYTES`].
    #[error(
        "Unable to complete the copy, the accumulated size increase of copy is {accumulated}, exceeding the limit {MAX_COPY_BYTES}"
    )]
    CopyTooLarge { accumulated: usize },
    /// An operation does not apply (a missing path, a failed test).
    #[error("{0}")]
    Apply(#[source] json_patch::PatchError),
}

/// Decode a JSON patch, refusing one of more than [`MAX_OPERATIONS`] operations before
/// decoding them.
pub fn decode(patch: &Value) -> Result<Vec<PatchOperation>, Error> {
    if let Some(ops) = patch.as_array()
        && ops.len() > MAX_OPERATIONS
    {
        return Err(Error::TooManyOperations(ops.len()));
    }
    serde_json::from_value(patch.clone()).map_err(Error::Decode)
}

/// Apply `ops` to `doc` in order. On error `doc` is left part-patched: callers patch a
/// copy they drop on failure.
pub fn apply(doc: &mut Value, ops: &[PatchOperation]) -> Result<(), Error> {
    if ops.len() > MAX_OPERATIONS {
        return Err(Error::TooManyOperations(ops.len()));
    }
    let mut copied = 0usize;
    for op in ops {
        if let PatchOperation::Copy(c) = op
            && let Some(from) = doc.pointer(c.from.as_str())
        {
            let budget = MAX_COPY_BYTES - copied;
            match encoded_len_within(from, budget) {
                Some(n) => copied += n,
                None => return Err(Error::CopyTooLarge { accumulated: copied + budget + 1 }),
            }
        }
        patch_unsafe(doc, std::slice::from_ref(op)).map_err(Error::Apply)?;
    }
    Ok(())
}

/// The length of `v` as compact JSON, if at most `budget` bytes (the encoding stops as soon
/// as it passes the budget).
fn encoded_len_within(v: &Value, budget: usize) -> Option<usize> {
    struct Counter {
        n: usize,
        budget: usize,
    }
    impl Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.n += buf.len();
            if self.n > self.budget {
                return Err(std::io::Error::other("over budget"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter { n: 0, budget };
    serde_json::to_writer(&mut c, v).ok().map(|_| c.n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn doubling_copies_stop_at_the_copy_budget() {
        let mut doc = json!({"a": "x".repeat(1024)});
        let mut ops = vec![json!({"op": "copy", "from": "/a", "path": "/b"})];
        // Each op copies the whole document so far into itself.
        for i in 0..21 {
            ops.push(json!({"op": "copy", "from": "", "path": format!("/c{i}")}));
        }
        let ops = decode(&json!(ops)).expect("decode");
        let started = std::time::Instant::now();
        match apply(&mut doc, &ops) {
            Err(e @ Error::CopyTooLarge { .. }) => {
                assert!(e.to_string().contains("exceeding the limit 3145728"), "{e}")
            }
            other => panic!("expected CopyTooLarge, got {other:?}"),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "bounded work");
        assert!(encoded_len_within(&doc, usize::MAX).expect("len") < 2 * MAX_COPY_BYTES);
    }

    #[test]
    fn operation_count_is_capped_before_decoding() {
        let ops = vec![json!({"op": "test", "path": "/a", "value": 1}); MAX_OPERATIONS + 1];
        match decode(&json!(ops)) {
            Err(e @ Error::TooManyOperations(10_001)) => {
                assert_eq!(
                    e.to_string(),
                    "The allowed maximum operations in a JSON patch is 10000, got 10001"
                )
            }
            other => panic!("expected TooManyOperations, got {other:?}"),
        }
        let mut doc = json!({"a": 1, "l": [1]});
        let ops = decode(&json!([
            {"op": "copy", "from": "/a", "path": "/b"},
            {"op": "add", "path": "/l/-", "value": 2},
            {"op": "test", "path": "/b", "value": 1},
        ]))
        .expect("decode");
        apply(&mut doc, &ops).expect("apply");
        assert_eq!(doc, json!({"a": 1, "b": 1, "l": [1, 2]}));
    }
}
