//! Which model each request names: conversations drawn to models by share, chains seeded by
//! the model.
//!
//! A conversation stays on one model, as a client keeps talking to the model it chose. The
//! workloads carry no conversation id except the agent sessions' (`SimRequest::session`), so a
//! conversation is found from the prompts, in arrival order: a request **continues** an
//! earlier request's conversation when its prompt holds that request's last full block at the
//! same position (that is, it begins with that request's whole prompt: the next turn of a
//! chat), the deepest match (then the most recent) when several match; otherwise it starts a
//! new one. A request with a session belongs to its session's conversation. A new
//! conversation draws its model once from a ChaCha8 RNG seeded by `seed` (one `f64` per
//! conversation, the models' shares cumulated in the order given), so the same workload and
//! seed give the same assignment anywhere.
//!
//! The rule is a heuristic, exact on the chat generator's conversations. Where it errs:
//! - a first turn that begins with another conversation's whole earlier prompt (a system
//!   prompt once sent nearly alone) joins that conversation;
//! - a Mooncake trace's next turn re-hashes the earlier turn's partial last 512-token id, so it
//!   holds that turn's last block only when the turn ended on a 512-token boundary: most of the
//!   trace's requests start conversations of their own (11,653 for 12,031 requests with two
//!   models). Matching at 512-token boundaries instead glues conversations together through
//!   the system prompt nearly every request of the trace shares (and the chat tenants' system
//!   prompts: 17 conversations for 6,000 chat requests), so it is not done.
//!
//! With more than one model, each request's block hashes are keyed by its model's chain seed
//! (`BlockHasher::chain_seed(model, None)`, the seed the gateway starts a request's chain
//! from): `h' = xxh3_64_with_seed(h, seed)`. Equal prefixes of one model keep equal hashes,
//! equal prefixes of two models share none, as with the gateway's model-seeded chains.
//!
//! Memory: one map entry (24 bytes + the map's overhead) per request with blocks, and one per
//! session, while assigning; the assignment kept is one `u16` per request.

use kvgate_core::{BlockHash, BlockHasher};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::ModelFleet;
use crate::SimRequest;

/// Salt of the assignment RNG, so a workload seed used for the workload itself draws a
/// different sequence here.
const ASSIGN_SEED_SALT: u64 = 0x6d6f_6465_6c73_0001; // "models"

/// Gives every request (in arrival order, `requests[i].id == i`) a model of `fleet`, by
/// conversation (module docs), and with more than one model keys its block chain by that
/// model. Returns each model's conversation count.
pub fn assign(fleet: &mut ModelFleet, requests: &mut [SimRequest], seed: u64) -> Vec<u64> {
    let shares = fleet.shares();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ASSIGN_SEED_SALT);
    let mut draw = |conversations: &mut Vec<u64>| -> u16 {
        let x: f64 = rng.random();
        let mut cumulated = 0.0;
        let mut pick = shares.len() - 1;
        for (i, s) in shares.iter().enumerate() {
            cumulated += s;
            if x < cumulated {
                pick = i;
                break;
            }
        }
        conversations[pick] += 1;
        pick as u16
    };
    let mut conversations = vec![0u64; shares.len()];
    // The model of the conversation ending (so far) in each block hash / holding each session.
    let mut by_last_block: FxHashMap<(BlockHash, usize), u16> = FxHashMap::default();
    let mut by_session: FxHashMap<u64, u16> = FxHashMap::default();
    let mut models = Vec::with_capacity(requests.len());
    for r in requests.iter() {
        let model = match r.session {
            Some(s) => *by_session
                .entry(s)
                .or_insert_with(|| draw(&mut conversations)),
            None => {
                let continued = r
                    .blocks
                    .iter()
                    .enumerate()
                    .rev()
                    .find_map(|(i, h)| by_last_block.get(&(*h, i)).copied());
                continued.unwrap_or_else(|| draw(&mut conversations))
            }
        };
        if let Some(last) = r.blocks.len().checked_sub(1) {
            by_last_block.insert((r.blocks[last], last), model);
        }
        models.push(model);
    }
    if fleet.is_mixed() {
        let seeds: Vec<BlockHash> = fleet
            .models()
            .iter()
            .map(|m| BlockHasher::chain_seed(&m.name, None))
            .collect();
        for (r, &m) in requests.iter_mut().zip(&models) {
            let seed = seeds[usize::from(m)];
            for h in &mut r.blocks {
                *h = xxh3_64_with_seed(&h.to_le_bytes(), seed);
            }
        }
    }
    fleet.set_request_models(models);
    conversations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::FleetModel;
    use crate::profiles::Profile;

    fn fleet(pods: &[(&str, u32)]) -> ModelFleet {
        ModelFleet::new(
            pods.iter()
                .map(|&(name, pods)| FleetModel {
                    name: name.into(),
                    pods,
                    profile: Profile::default_profile(),
                    share: None,
                })
                .collect(),
        )
        .unwrap()
    }

    /// `conversations` chats of 1–5 turns, interleaved: conversation c's prompts open with its
    /// tenant's (c mod 4) 5-block system prompt; each turn adds 3 blocks of its own (chained
    /// hashes: a block of one conversation's turn is unique to it). Returns the requests in
    /// arrival order and each one's conversation.
    fn chats(conversations: u64) -> (Vec<SimRequest>, Vec<u64>) {
        let mut prompts: Vec<(u64, Vec<BlockHash>, u64)> = Vec::new();
        for c in 0..conversations {
            let tenant = c % 4;
            let mut blocks: Vec<BlockHash> = (0..5).map(|i| 1_000 + tenant * 10 + i).collect();
            for turn in 0..1 + c % 5 {
                blocks.extend((0..3).map(|k| 1_000_000 + c * 1_000 + turn * 10 + k));
                // Turn t of conversation c arrives at c + 7t: conversations overlap.
                prompts.push((c + 7 * turn, blocks.clone(), c));
            }
        }
        prompts.sort_by_key(|p| p.0);
        let conversation = prompts.iter().map(|p| p.2).collect();
        let requests = prompts
            .into_iter()
            .enumerate()
            .map(|(id, (at, blocks, _))| SimRequest {
                id: id as u64,
                arrival_ms: at as f64,
                input_tokens: blocks.len() as u32 * 16,
                output_tokens: 4,
                blocks,
                adapter: None,
                session: None,
            })
            .collect();
        (requests, conversation)
    }

    #[test]
    fn every_turn_of_a_conversation_keeps_its_first_turns_model() {
        let (mut requests, conversation) = chats(400);
        let mut f = fleet(&[("a", 4), ("b", 4)]);
        let drawn = assign(&mut f, &mut requests, 7);
        assert_eq!(drawn.iter().sum::<u64>(), 400, "one draw per conversation");
        assert!(drawn.iter().all(|&c| c > 150), "{drawn:?}");
        let mut model_of = std::collections::HashMap::new();
        for (r, c) in requests.iter().zip(&conversation) {
            let m = *model_of.entry(c).or_insert(f.request_model(r.id));
            assert_eq!(
                f.request_model(r.id),
                m,
                "request {} of conversation {c}",
                r.id
            );
        }
        assert_eq!(
            f.requests_per_model().iter().sum::<u64>(),
            requests.len() as u64
        );
    }

    #[test]
    fn shares_follow_the_pods_and_the_seed_replays_the_draw() {
        let (original, _) = chats(2000);
        let mut a = original.clone();
        let mut f = fleet(&[("a", 1), ("b", 3)]);
        let drawn = assign(&mut f, &mut a, 3);
        let share_b = drawn[1] as f64 / drawn.iter().sum::<u64>() as f64;
        assert!((share_b - 0.75).abs() < 0.05, "{drawn:?}");
        let mut b = original.clone();
        let mut g = fleet(&[("a", 1), ("b", 3)]);
        assert_eq!(assign(&mut g, &mut b, 3), drawn);
        assert_eq!(a, b, "same seed, same chains");
        assert_eq!(f, g);
        let mut c = original.clone();
        let mut h = fleet(&[("a", 1), ("b", 3)]);
        assign(&mut h, &mut c, 4);
        assert_ne!(f, h, "another seed, another draw");
    }

    #[test]
    fn chains_are_keyed_by_model_so_two_models_share_no_prefix() {
        let (original, _) = chats(200);
        let mut requests = original.clone();
        let mut f = fleet(&[("a", 2), ("b", 2)]);
        assign(&mut f, &mut requests, 1);
        let mut shared_within = 0;
        for (i, r) in requests.iter().enumerate() {
            for (j, o) in requests.iter().enumerate().take(i) {
                // The system prompt's first block: shared by a tenant's conversations.
                let before = original[i].blocks[0] == original[j].blocks[0];
                let after = r.blocks[0] == o.blocks[0];
                if f.request_model(r.id) == f.request_model(o.id) {
                    assert_eq!(before, after, "one model keeps its sharing ({i}, {j})");
                    shared_within += u32::from(after);
                } else {
                    assert!(!after, "requests {i} and {j} of two models share a block");
                }
            }
        }
        assert!(shared_within > 1000, "{shared_within}");
    }

    #[test]
    fn one_model_leaves_the_chains_alone_and_sessions_stay_whole() {
        let (original, _) = chats(100);
        let mut requests = original.clone();
        let mut f = fleet(&[("only", 8)]);
        assert_eq!(assign(&mut f, &mut requests, 1), vec![100]);
        assert_eq!(requests, original);

        // Sessions decide the conversation even with unrelated prompts.
        let mut reqs: Vec<SimRequest> = (0..200u64)
            .map(|i| SimRequest {
                id: i,
                arrival_ms: i as f64,
                input_tokens: 16,
                output_tokens: 1,
                blocks: vec![i * 7 + 1],
                adapter: None,
                session: Some(i % 10),
            })
            .collect();
        let mut f = fleet(&[("a", 1), ("b", 1)]);
        assert_eq!(assign(&mut f, &mut reqs, 9).iter().sum::<u64>(), 10);
        for r in &reqs {
            assert_eq!(f.request_model(r.id), f.request_model(r.session.unwrap()));
        }
    }
}
