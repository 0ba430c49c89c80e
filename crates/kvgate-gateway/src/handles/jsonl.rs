//! An append-only JSON-lines file written by its own thread: what `--decisions-log` writes
//! through ([`crate::decisions`]).
//!
//! Bound: at most [`QUEUE`] values wait for the writer; a full queue drops the value and counts
//! it on the counter given at open. Lines are flushed whenever the queue is empty. A write error
//! stops the writer (logged once); later values count as dropped. Nothing rotates the file.

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Values queued for the writer at most.
pub const QUEUE: usize = 4096;

/// An open JSON-lines file of `T`s.
pub struct JsonLines<T> {
    tx: SyncSender<T>,
    dropped: Counter,
}

impl<T: Serialize + Send + 'static> JsonLines<T> {
    /// Opens `path` for appending and starts its writer thread.
    pub fn open(path: &Path, dropped: Counter) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("kvgate-jsonl".into())
            .spawn(move || write_all(rx, std::io::BufWriter::new(file)))?;
        Ok(JsonLines { tx, dropped })
    }

    /// Queues `value`; never blocks (a full queue or a stopped writer drops it, counted).
    pub fn send(&self, value: T) {
        if self.tx.try_send(value).is_err() {
            self.dropped.inc();
        }
    }
}

/// The writer: one line per value, flushed whenever the queue is empty.
fn write_all<T: Serialize>(rx: Receiver<T>, mut out: impl Write) {
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(v) = next.take() {
            let written = serde_json::to_writer(&mut out, &v)
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n"));
            if let Err(e) = written {
                tracing::warn!(error = %e, "JSON-lines file: cannot write; it stops here");
                return;
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = out.flush() {
            tracing::warn!(error = %e, "JSON-lines file: cannot write; it stops here");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Line {
        id: u32,
        note: Option<&'static str>,
    }

    #[test]
    fn each_value_is_one_line_in_the_order_sent() {
        let path = std::env::temp_dir().join(format!("kvgate-jsonl-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let file = JsonLines::open(&path, Counter::default()).unwrap();
        file.send(Line {
            id: 1,
            note: Some("a"),
        });
        file.send(Line { id: 2, note: None });
        drop(file);
        let mut text = String::new();
        for _ in 0..500 {
            text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            text,
            "{\"id\":1,\"note\":\"a\"}\n{\"id\":2,\"note\":null}\n"
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (tx, _rx) = sync_channel(1);
        let dropped = Counter::default();
        let file = JsonLines {
            tx,
            dropped: dropped.clone(),
        };
        file.send(Line { id: 1, note: None });
        file.send(Line { id: 2, note: None });
        assert_eq!(dropped.get(), 1);
    }
}
