//! The simulated network between router replicas (`kvgate sim --replicas R --share`): each
//! replica runs the core's [`ReplicaMachine`], the code `kvgate serve --cluster` runs, and this
//! module only carries its messages.
//!
//! # Model
//!
//! - **Replicas.** Replica `i` (of `R`) is machine id `i`; its pods are named by their index
//!   ([`SimPods`]), as every replica of a run has the same fleet.
//! - **Carrying.** After each transition the cluster loop asks the replica's machine for what
//!   it queued ([`Mesh::transmit`]); every event goes as a message of its own, one copy per
//!   other replica, each copy lost with probability `loss` (drawn from a ChaCha8 RNG seeded by
//!   the run's seed) and due `delay_ms` later. The delay is constant, so copies arrive in the
//!   order they were sent. (The gateway puts whatever is queued into one NATS message; NATS
//!   drops no message of a live connection, so loss here stands for a link that misbehaves.)
//! - **Arrival.** A copy is applied to its replica's session when it is due
//!   ([`Mesh::advance`], and [`Mesh::deliver`] right before a routing decision), through the
//!   machine's [`ReplicaMachine::handle_message`]: dedup, the peers' ledger charges, routed
//!   index and training samples, exactly as the gateway's receiver.
//! - **Time.** The machines' timers (snapshot every second, lease check every 250 ms) run at
//!   their due times ([`Mesh::advance`]).
//!
//! # Parameters
//!
//! [`Sharing`]: `delay_ms` (`--share-delay-ms`, default 1), `loss` (`--share-loss`, default
//! 0), `samples` (`--share-no-samples` turns it off; default on, as `cluster_share_samples`).
//! The machines run [`ReplicaConfig::default`] (the gateway's defaults).
//!
//! # Bounds
//!
//! The machines' (see [`kvgate_core::session::replica`]). In transit: one entry per copy not
//! yet due, i.e. the events of the last `delay_ms` times `R − 1`.

use std::collections::VecDeque;
use std::rc::Rc;

use kvgate_core::session::replica::{PodKeys, ReplicaConfig, ReplicaMachine, ReplicaMessage};
use kvgate_core::{PodId, PodSnapshot, RouterSession};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

const SHARE_LOSS_SEED_SALT: u64 = 0x5ba7_e0f1_0550_0001;

/// How replicas share their routing events (`--share-delay-ms`, `--share-loss`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sharing {
    /// Publish-to-apply delay of every event, ms (NATS on a LAN: well under 1 ms).
    pub delay_ms: f64,
    /// Probability that one event is lost on its way to one replica.
    pub loss: f64,
    /// Share each completed request's predictor training sample, as `kvgate serve
    /// --cluster` does by default (`cluster_share_samples`).
    pub samples: bool,
}

/// The fleet's pods by index, for the machines.
pub struct SimPods<'a>(pub &'a [PodSnapshot]);

impl PodKeys for SimPods<'_> {
    fn pod(&self, key: u64) -> Option<PodId> {
        self.0.get(key as usize).map(|p| p.id)
    }

    fn class(&self, key: u64) -> Option<&str> {
        self.0.get(key as usize).map(|p| &*p.class)
    }
}

/// A message on its way to one replica.
#[derive(Debug)]
struct Delivery {
    at_ms: f64,
    to: usize,
    msg: Rc<ReplicaMessage>,
}

/// The replicas' machines and the network between them; see the module docs.
#[derive(Debug)]
pub struct Mesh {
    sharing: Sharing,
    machines: Vec<ReplicaMachine>,
    /// Copies in time order (a constant delay keeps send order).
    queue: VecDeque<Delivery>,
    rng: ChaCha8Rng,
}

impl Mesh {
    /// `replicas` machines started at time 0, the loss RNG seeded from `seed`.
    pub fn new(sharing: Sharing, replicas: usize, seed: u64) -> Self {
        let config = ReplicaConfig {
            share_samples: sharing.samples,
            ..ReplicaConfig::default()
        };
        Mesh {
            sharing,
            machines: (0..replicas as u64)
                .map(|i| ReplicaMachine::new(i, config, 0))
                .collect(),
            queue: VecDeque::new(),
            rng: ChaCha8Rng::seed_from_u64(seed ^ SHARE_LOSS_SEED_SALT),
        }
    }

    /// Runs one of `replica`'s own transitions in its machine at `at_ms` and sends what it
    /// queued.
    pub fn on<T>(
        &mut self,
        replica: usize,
        at_ms: f64,
        f: impl FnOnce(&mut ReplicaMachine) -> T,
    ) -> T {
        let out = f(&mut self.machines[replica]);
        self.transmit(replica, at_ms);
        out
    }

    /// Sends `from`'s queued events at `at_ms`: each a message of its own, one copy per other
    /// replica, each lost with the sharing's `loss`.
    fn transmit(&mut self, from: usize, at_ms: f64) {
        loop {
            let mut taken = 0;
            let Some(msg) = self.machines[from].poll_transmit(|_| {
                taken += 1;
                taken == 1
            }) else {
                return;
            };
            let msg = Rc::new(msg);
            for to in (0..self.machines.len()).filter(|&to| to != from) {
                if self.sharing.loss > 0.0 && self.rng.random::<f64>() < self.sharing.loss {
                    continue;
                }
                self.queue.push_back(Delivery {
                    at_ms: at_ms + self.sharing.delay_ms,
                    to,
                    msg: msg.clone(),
                });
            }
        }
    }

    /// When something is next due: a copy arriving, or a machine's timer.
    pub fn next_due_ms(&self) -> Option<f64> {
        let timer = self.machines.iter().map(ReplicaMachine::poll_timeout).min();
        let arrival = self.queue.front().map(|d| d.at_ms);
        match (timer, arrival) {
            (Some(t), Some(a)) => Some((t as f64).min(a)),
            (t, a) => t.map(|t| t as f64).or(a),
        }
    }

    /// Applies every copy due by `now` (included) to its replica's session.
    pub fn deliver(&mut self, now: f64, sessions: &mut [RouterSession], pods: &[PodSnapshot]) {
        while self.queue.front().is_some_and(|d| d.at_ms <= now) {
            let Some(d) = self.queue.pop_front() else {
                break;
            };
            self.machines[d.to].handle_message(
                d.at_ms as u64,
                &mut sessions[d.to],
                &SimPods(pods),
                &d.msg,
            );
        }
    }

    /// Moves the network to `t`: the copies due, then every machine's timer due (its lease
    /// check, its snapshot sent).
    pub fn advance(&mut self, t: f64, sessions: &mut [RouterSession], pods: &[PodSnapshot]) {
        self.deliver(t, sessions, pods);
        let replicas = self.machines.len();
        for (i, session) in sessions.iter_mut().enumerate().take(replicas) {
            if self.machines[i].poll_timeout() as f64 <= t {
                self.machines[i].handle_timeout(t as u64, session);
                self.transmit(i, t);
            }
        }
    }

    /// Returns every peer charge each replica holds (the end of a run: own requests only).
    pub fn forget_peers(&mut self, sessions: &mut [RouterSession]) {
        for (machine, session) in self.machines.iter_mut().zip(sessions) {
            machine.forget_peers(session);
        }
    }
}
