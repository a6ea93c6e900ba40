//! The msgpack encoding of a batch, in the layout vLLM's msgspec structs take when encoded as
//! arrays with a tag (each event an array whose first element is its type name):
//!
//! - batch: `[ts, [event, ...], data_parallel_rank]`
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`
//! - `["BlockRemoved", block_hashes, medium]`
//! - `["AllBlocksCleared"]`
//!
//! Hashes are unsigned 64-bit integers; `parent_block_hash` is nil for a prompt's first block,
//! `lora_id` is always nil (no adapters), `medium` is `"GPU"` (the engine's KV pool, whatever
//! the device: it is the tier routers rank first).

use serde::ser::{Serialize, SerializeSeq, Serializer};

use super::Batch;
use crate::kv_cache::KvEvent;

/// The `medium` of every event.
pub const MEDIUM: &str = "GPU";

struct Event<'a> {
    event: &'a KvEvent,
    block_size: usize,
}

impl Serialize for Event<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.event {
            KvEvent::Stored {
                hashes,
                parent,
                tokens,
            } => (
                "BlockStored",
                hashes,
                parent,
                tokens,
                self.block_size,
                None::<u32>,
                MEDIUM,
            )
                .serialize(s),
            KvEvent::Removed { hashes } => ("BlockRemoved", hashes, MEDIUM).serialize(s),
            KvEvent::Cleared => ("AllBlocksCleared",).serialize(s),
        }
    }
}

struct Events<'a> {
    events: &'a [KvEvent],
    block_size: usize,
}

impl Serialize for Events<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.events.len()))?;
        for event in self.events {
            seq.serialize_element(&Event {
                event,
                block_size: self.block_size,
            })?;
        }
        seq.end()
    }
}

/// The msgpack `EventBatch` of `batch`.
pub fn encode(batch: &Batch, block_size: usize, data_parallel_rank: u32) -> Vec<u8> {
    let body = (
        batch.ts,
        Events {
            events: &batch.events,
            block_size,
        },
        data_parallel_rank,
    );
    // Serializing tuples, strings and integers into a Vec cannot fail.
    rmp_serde::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    #[test]
    fn a_batch_is_arrays_with_a_type_tag_in_vllm_field_order() {
        let batch = Batch {
            seq: 3,
            ts: 1.5,
            events: vec![
                KvEvent::Cleared,
                KvEvent::Stored {
                    hashes: vec![u64::MAX, 7],
                    parent: None,
                    tokens: vec![1, 2, 3, 4],
                },
                KvEvent::Stored {
                    hashes: vec![9],
                    parent: Some(7),
                    tokens: vec![5, 6],
                },
                KvEvent::Removed { hashes: vec![7, 9] },
            ],
        };
        let bytes = encode(&batch, 2, 4);
        let v = rmpv::decode::read_value(&mut bytes.as_slice()).expect("msgpack");
        let s = |x: &str| Value::from(x);
        let want = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![s("AllBlocksCleared")]),
                Value::Array(vec![
                    s("BlockStored"),
                    Value::Array(vec![Value::from(u64::MAX), Value::from(7u64)]),
                    Value::Nil,
                    Value::Array((1..=4u32).map(Value::from).collect()),
                    Value::from(2u64),
                    Value::Nil,
                    s("GPU"),
                ]),
                Value::Array(vec![
                    s("BlockStored"),
                    Value::Array(vec![Value::from(9u64)]),
                    Value::from(7u64),
                    Value::Array(vec![Value::from(5u32), Value::from(6u32)]),
                    Value::from(2u64),
                    Value::Nil,
                    s("GPU"),
                ]),
                Value::Array(vec![
                    s("BlockRemoved"),
                    Value::Array(vec![Value::from(7u64), Value::from(9u64)]),
                    s("GPU"),
                ]),
            ]),
            Value::from(4u32),
        ]);
        assert_eq!(v, want);
    }
}
