//! One worker slot fed by an agent: it reserves ahead (prefetch) so the
//! agent never waits on the queue, keeps two requests in the agent's pipe,
//! finalizes passed tests in batches, and survives the agent: a test over
//! its time limit kills the agent (reason `timeout`), a test that kills it
//! fails (reason `crashed`), and a fresh agent takes the rest.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::queue::MAX_SUMMARY_LEN;
use leasehold_core::{Ack, Delivery, FinalizeRequest, Outcome};
use tokio::time::Instant;

use crate::agent::child::{agent_env, AgentChild, AgentCommand, NotReady, SLOT_ENV};
use crate::agent::outside_errors::OutsideErrors;
use crate::agent::protocol::{Reply, Request, TestOutcome, PROTOCOL};
use crate::agent::shards::{Collected, Starvation, STEAL_AFTER};
use crate::agent::AgentError;
use crate::errors::HopperError;
use crate::units::discover::shown;
use crate::verdicts::skips;
use crate::worker::observer::AttemptEnd;
use crate::worker::transitions::{
    fenced_off, hand_back, idle, requeue_failed, reserve, slot_number, Idle, Shared, MIN_WAIT,
};

/// Requests in the agent's pipe at once: the running test and the next, so
/// the agent starts the next without waiting for hopper.
const PIPELINE: usize = 2;
/// Work (by average test time) a slot reserves ahead.
const PREFETCH_WINDOW: Duration = Duration::from_millis(500);
/// Most units a slot reserves in one call.
const MAX_PREFETCH: usize = 64;

/// Sharded: units a worker's pool may hold per slot (within its share).
const POOL_PER_SLOT: usize = 1024;
/// Passed tests finalized in one call at most, and how long one waits.
const FLUSH_AT: usize = 64;
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// Agents that die in a row without giving one result end the slot.
const MAX_BARREN_STARTS: u32 = 3;
/// Output kept with a failure (the queue's payload has a size limit).
const OUTPUT_MAX: usize = MAX_SUMMARY_LEN / 2;

struct Sent {
    seq: u64,
    delivery: Delivery,
    started: Option<Instant>,
}

struct Slot {
    shared: Arc<Shared>,
    command: Arc<AgentCommand>,
    slot: usize,
    agent: Option<AgentChild>,
    buffer: VecDeque<Delivery>,
    sent: VecDeque<Sent>,
    done: Vec<(Delivery, FinalizeRequest, Duration)>,
    last_flush: Instant,
    next_seq: u64,
    /// The average test time seen so far; `None` before the first result.
    avg_ms: Option<f64>,
    barren_starts: u32,
    /// No reserve before this while the agent has work (the queue was empty).
    dry_until: Instant,
    dry_backoff: Duration,
    /// Sharded: the files this slot's agent has collected.
    collected: Collected,
    /// Sharded: how long this slot found none of its units while the pool
    /// was full of its siblings'.
    starvation: Starvation,
}

/// Runs one slot with an agent until every unit is finalized or the worker stops.
pub(super) async fn slot_loop(shared: Arc<Shared>, slot: usize, command: Arc<AgentCommand>) -> Result<(), HopperError> {
    let mut state = Slot {
        shared,
        command,
        slot,
        agent: None,
        buffer: VecDeque::new(),
        sent: VecDeque::new(),
        done: Vec::new(),
        last_flush: Instant::now(),
        next_seq: 1,
        avg_ms: None,
        barren_starts: 0,
        dry_until: Instant::now(),
        dry_backoff: Duration::from_millis(2),
        collected: Collected::default(),
        starvation: Starvation::default(),
    };
    if let Some(sharding) = &state.command.sharding {
        state.collected.shard = sharding.shard_of_slot(slot);
    }
    let result = state.run().await;
    if result.is_err() || state.shared.stop.is_cancelled() {
        state.give_up().await;
    }
    result
}

impl Slot {
    async fn run(&mut self) -> Result<(), HopperError> {
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let mut wait = MIN_WAIT;
        let mut lost = shared.held.watch_lost();
        loop {
            if shared.stop.is_cancelled() {
                return Ok(());
            }
            // Reserve while the agent still has requests in its pipe, so it
            // never waits for the queue's round trip.
            let dry = self.sent.len() + self.buffer.len() > 0 && Instant::now() < self.dry_until;
            if self.wants_more() && !dry {
                self.flush().await?;
                let got = self.refill().await?;
                if got {
                    wait = MIN_WAIT;
                    self.dry_backoff = MIN_WAIT;
                } else {
                    // Nothing to take while this agent is busy: look again later, not on every reply.
                    self.dry_until = Instant::now() + self.dry_backoff;
                    self.dry_backoff = (self.dry_backoff * 2).min(config.idle_poll);
                }
            }
            if shared.kills_running() {
                // `--max-failures-kill`: the agent's tests are stopped too.
                self.give_up().await;
                return Ok(());
            }
            if shared.halt.is_cancelled() {
                self.hand_back_unsent().await;
            }
            if self.buffer.is_empty() && self.sent.is_empty() {
                self.flush().await?;
                match idle(&shared, &mut wait).await? {
                    Idle::Complete => {
                        // An agent started for this slot that never got a test ends the same way.
                        if let Some(agent) = self.agent.take().or_else(|| self.command.spare.take(self.slot)) {
                            let (timeout, grace) = (config.limits.timeout, config.limits.kill_grace);
                            self.outside().exit_awaiting_teardown(agent, timeout, grace).await?;
                        }
                        return Ok(());
                    }
                    Idle::Stopped => return Ok(()),
                    Idle::Again => continue,
                }
            }
            if self.agent.is_none() {
                self.start_agent().await?;
                continue;
            }
            self.feed().await;
            let deadline = match (config.limits.timeout, self.sent.front().and_then(|s| s.started)) {
                (Some(limit), Some(started)) => Some(started + limit),
                _ => None,
            };
            let flush_at = self.last_flush + FLUSH_EVERY;
            let Some(agent) = self.agent.as_mut() else { continue };
            tokio::select! {
                line = agent.next_line() => match line {
                    Ok(Some(line)) => self.on_line(&line).await?,
                    Ok(None) | Err(_) => self.on_crash().await?,
                },
                _ = sleep_until_some(deadline) => self.on_timeout().await?,
                _ = tokio::time::sleep_until(flush_at), if !self.done.is_empty() => self.flush().await?,
                Ok(()) = lost.changed() => self.drop_lost(),
                _ = shared.stop.cancelled() => {}
                _ = shared.halt.cancelled(), if config.stop_running_on_halt => {}
            }
        }
    }

    /// Units this slot should hold (running, in the agent's pipe and
    /// buffered): about `PREFETCH_WINDOW` of work at the average test time
    /// seen so far, but no more than about half this slot's share of what
    /// still waits in the queue, and one near the end of the build: as the
    /// queue drains, so does what a slot holds, and no slot sits on units an
    /// idle one could run.
    ///
    /// Before the first result the test time is unknown: a slot takes only
    /// [`PIPELINE`] units, so that the first worker of a build does not sit
    /// on a large share of it while the others are still starting.
    fn prefetch(&self) -> usize {
        if self.shared.near_end() {
            return 1;
        }
        let by_time = match self.avg_ms {
            Some(avg_ms) => {
                ((PREFETCH_WINDOW.as_secs_f64() * 1000.0 / avg_ms.max(0.1)) as usize).clamp(PIPELINE, MAX_PREFETCH)
            }
            None => PIPELINE,
        };
        by_time.min(self.shared.share_per_slot()).max(1)
    }

    /// Units reserved and not yet finished here.
    fn held(&self) -> usize {
        self.buffer.len() + self.sent.len()
    }

    async fn refill(&mut self) -> Result<bool, HopperError> {
        let want = self.prefetch().saturating_sub(self.held()).max(1);
        if self.command.sharding.is_none() {
            let deliveries = self.reserve(want).await?;
            let got = deliveries.is_some();
            self.take(deliveries.unwrap_or_default());
            return Ok(got);
        }
        self.refill_sharded(want).await
    }

    /// Sharded: units of the files this slot's agent collected, from the
    /// worker's pool, which a reservation for every slot fills when it has
    /// none; a unit that waited in the pool past [`STEAL_AFTER`] is taken
    /// whatever its file (its agent then collects that file), and so is one
    /// when this slot starved beside a full pool (see [`Starvation`]).
    async fn refill_sharded(&mut self, want: usize) -> Result<bool, HopperError> {
        let Some(sharding) = self.command.sharding.clone() else { return Ok(false) };
        let mine = sharding.pool.lock().take_collected(&sharding, &self.collected, want);
        if !mine.is_empty() {
            self.take(mine);
            return Ok(true);
        }
        let mut reserved = false;
        // The pool holds the siblings' units for a while: no more than the
        // worker's share of the queue (other workers of the build take the
        // rest), so a slot whose own files have nothing to give now (their
        // units run elsewhere, or wait for their group) does not reserve the
        // whole build into it. Within that share it holds up to
        // POOL_PER_SLOT units a slot: the queue interleaves the shards by
        // test count, not by time, so a slot whose tests are slower than
        // its siblings' finds its own units only deeper in the queue.
        let cap = (self.shared.share_per_slot() * sharding.count()).min(POOL_PER_SLOT * sharding.count());
        // Near the end of the build a unit reserved for a busy sibling would
        // wait in the pool while another worker's slot sits idle: reserve
        // for this slot alone.
        let for_pool = if self.shared.near_end() { want } else { want * sharding.count() };
        let full = sharding.pool.lock().len() >= cap;
        if !full {
            if let Some(batch) = self.reserve(for_pool).await? {
                reserved = true;
                let mut pool = sharding.pool.lock();
                pool.put(batch, Instant::now());
                let mine = pool.take_collected(&sharding, &self.collected, want);
                drop(pool);
                if !mine.is_empty() {
                    self.take(mine);
                    return Ok(true);
                }
            }
        }
        // A slot whose shard got no files (fewer files than agents) has
        // nothing of its own to wait for, and near the end of the build an
        // idle slot would wait out the tail: those take any file at once.
        let starved = full && self.starvation.starving(Instant::now());
        let steal_after = if sharding.expected(self.slot) == 0 || self.shared.near_end() || starved {
            Duration::ZERO
        } else {
            STEAL_AFTER
        };
        let stolen = sharding.pool.lock().steal(Instant::now() - steal_after, want);
        if let Some((file, stolen)) = stolen {
            tracing::debug!(slot = self.slot, file, units = stolen.len(), "taking another shard's units that waited");
            self.collected.extra_files.insert(file);
            self.starvation.reset();
            self.take(stolen);
            return Ok(true);
        }
        // Units reserved for the siblings count as progress: look again soon.
        Ok(reserved)
    }

    /// Reserves up to `want` units; `None` when the queue gave nothing.
    async fn reserve(&mut self, want: usize) -> Result<Option<Vec<Delivery>>, HopperError> {
        let want = std::num::NonZeroUsize::new(want).unwrap_or(std::num::NonZeroUsize::MIN);
        let reserved = reserve(&self.shared, want).await?;
        Ok(reserved.moved.then_some(reserved.deliveries))
    }

    /// Moves units into this slot's buffer (a slot that got units is not starved).
    fn take(&mut self, deliveries: Vec<Delivery>) {
        self.starvation.fed(Instant::now());
        self.shared.running.lock().extend(deliveries.iter().map(|d| d.unit.clone()));
        self.buffer.extend(deliveries);
    }

    async fn start_agent(&mut self) -> Result<(), HopperError> {
        // A fresh agent has collected its shard only.
        self.collected.extra_files.clear();
        if let Some(mut agent) = self.command.spare.take(self.slot) {
            self.outside().record_early(&mut agent).await?;
            self.agent = Some(agent);
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;
        let mut env = agent_env(&config.run, &config.worker);
        env.push((SLOT_ENV.to_owned(), self.slot.to_string()));
        env.extend(self.command.slot_env(self.slot));
        let shown = shown(&self.command.argv);
        let mut agent = AgentChild::spawn(&self.command, &env, config.limits.tail_bytes)
            .map_err(|source| AgentError::Spawn { command: shown.clone(), source })?;
        let ready = tokio::select! {
            ready = agent.wait_ready() => ready,
            _ = shared.stop.cancelled() => {
                agent.finish(config.limits.kill_grace, true).await;
                return Ok(());
            }
        };
        match ready {
            Ok(tests) => {
                if let (Some(want), Some(got)) = (self.command.expected_for(self.slot), tests) {
                    if want != got {
                        agent.kill().await;
                        return Err(AgentError::CollectedOther { expected: want, collected: got }.into());
                    }
                }
                tracing::debug!(slot = self.slot, "a fresh agent is ready");
                self.outside().record_early(&mut agent).await?;
                self.agent = Some(agent);
                Ok(())
            }
            Err(NotReady::Protocol(got)) => {
                agent.kill().await;
                Err(AgentError::Protocol { got, want: PROTOCOL }.into())
            }
            Err(NotReady::Died { last_line, .. }) => {
                let status = agent.finish(config.limits.kill_grace, false).await.to_string();
                Err(AgentError::DiedBeforeReady { command: shown, status, last_line }.into())
            }
        }
    }

    /// Whether to reserve now: while fewer than [`PIPELINE`] units wait
    /// here and the slot holds less than its [`prefetch`](Self::prefetch),
    /// so the agent never waits on the queue; near the end of the queue only
    /// when the slot holds nothing, so that no unit waits here behind a
    /// running one while another slot could run it.
    fn wants_more(&self) -> bool {
        if self.pipeline() == 1 {
            self.held() == 0
        } else {
            self.buffer.len() < PIPELINE && self.held() < self.prefetch()
        }
    }

    /// Requests to keep in the agent's pipe: [`PIPELINE`], or one near the
    /// end of the queue, where a second would wait here while another slot
    /// may be idle.
    fn pipeline(&self) -> usize {
        if self.shared.near_end() || self.shared.share_per_slot() <= 1 {
            1
        } else {
            PIPELINE
        }
    }

    async fn feed(&mut self) {
        let depth = self.pipeline();
        while self.sent.len() < depth {
            let Some(delivery) = self.buffer.pop_front() else { break };
            let seq = self.next_seq;
            self.next_seq += 1;
            if let Some(agent) = self.agent.as_mut() {
                if let Err(error) = agent.send(&Request::Run { seq, test: delivery.unit.as_str() }).await {
                    // A dead agent: its closed stdout is seen next and handled as a crash.
                    tracing::debug!(%error, "could not write to the agent");
                }
            }
            self.sent.push_back(Sent { seq, delivery, started: None });
        }
    }

    async fn on_line(&mut self, line: &str) -> Result<(), HopperError> {
        match Reply::parse(line) {
            Ok(Reply::Started { seq }) => {
                if let Some(sent) = self.sent.iter_mut().find(|s| s.seq == seq) {
                    sent.started = Some(Instant::now());
                }
            }
            Ok(Reply::Result { seq, outcome, duration_ms, message, output, reruns }) => {
                let Some(at) = self.sent.iter().position(|s| s.seq == seq) else {
                    tracing::warn!(seq, "agent reported a request hopper did not send; ignored");
                    return Ok(());
                };
                let Some(sent) = self.sent.remove(at) else { return Ok(()) };
                self.barren_starts = 0;
                // Up fast, down slowly: a suite whose tests get slower (a
                // slow tail) shrinks the prefetch before a slot sits on it.
                let latest = duration_ms as f64;
                self.avg_ms = Some(match self.avg_ms {
                    Some(avg) => {
                        let weight = if latest > avg { 0.5 } else { 0.1 };
                        avg * (1.0 - weight) + latest * weight
                    }
                    None => latest,
                });
                let duration = Duration::from_millis(duration_ms);
                self.untrack(&sent.delivery);
                self.shared.summary.lock().timings.push((sent.delivery.unit.to_string(), duration_ms));
                match outcome {
                    TestOutcome::Passed | TestOutcome::Skipped => {
                        let outcome = if outcome == TestOutcome::Passed { Outcome::Passed } else { Outcome::Skipped };
                        let request =
                            crate::verdicts::skips::finalize_request(outcome, duration_ms, message.as_deref())
                                .on_slot(slot_number(self.slot));
                        let tries = reruns.iter().map(|r| {
                            (r.message.as_deref().unwrap_or("failed"), r.output.as_deref().unwrap_or_default())
                        });
                        let request = crate::verdicts::reruns::with_reruns(request, tries);
                        // A group's unit holds one of the group's places until
                        // it is finalized: free it now, not at the next flush.
                        let grouped = self.shared.in_group(&sent.delivery.unit);
                        self.done.push((sent.delivery, request, duration));
                        if self.done.len() >= FLUSH_AT || grouped {
                            self.flush().await?;
                        }
                    }
                    TestOutcome::Failed => {
                        let detail = message.unwrap_or_else(|| "failed".into());
                        self.fail(&sent.delivery, "failed", &detail, output.as_deref().unwrap_or(""), duration).await?;
                    }
                }
            }
            Ok(reply @ (Reply::Error { .. } | Reply::Skipped { .. })) => {
                self.outside().record(&Vec::from_iter(reply.outside_error())).await?
            }
            Ok(Reply::Ready { .. }) => tracing::warn!("agent said ready twice; ignored"),
            Err(error) => tracing::warn!(%error, line, "agent wrote a line that is not the protocol; ignored"),
        }
        Ok(())
    }

    /// The agent died: the test it was running fails (`crashed`), the
    /// requests it had not started go back to the front of the buffer.
    async fn on_crash(&mut self) -> Result<(), HopperError> {
        let Some(agent) = self.agent.take() else { return Ok(()) };
        let tail = agent.stderr_tail(OUTPUT_MAX);
        let status = agent.finish(self.shared.config.limits.kill_grace, false).await.to_string();
        let running = self.requeue_unstarted();
        match running {
            Some(sent) => {
                self.barren_starts = 0;
                let detail = format!("crashed: the test process died while running it ({status})");
                let duration = sent.started.map(|s| s.elapsed()).unwrap_or_default();
                self.untrack(&sent.delivery);
                self.fail(&sent.delivery, "crashed", &detail, &tail, duration).await?;
            }
            None => {
                self.barren_starts += 1;
                tracing::warn!(%status, "the agent died between tests; starting a fresh one");
                if self.barren_starts >= MAX_BARREN_STARTS {
                    return Err(AgentError::KeepsDying {
                        times: self.barren_starts,
                        status,
                        last_line: crate::exec::process::last_line(&tail).to_owned(),
                    }
                    .into());
                }
            }
        }
        Ok(())
    }

    /// The running test is over its limit: kill the agent, fail the test
    /// (`timeout`), and let a fresh agent take the rest.
    async fn on_timeout(&mut self) -> Result<(), HopperError> {
        let Some(agent) = self.agent.take() else { return Ok(()) };
        let tail = agent.stderr_tail(OUTPUT_MAX);
        agent.finish(self.shared.config.limits.kill_grace, true).await;
        if let Some(sent) = self.requeue_unstarted() {
            let limit = self.shared.config.limits.timeout.unwrap_or_default();
            let detail = format!("timed out after {:.1}s", limit.as_secs_f64());
            self.untrack(&sent.delivery);
            self.fail(&sent.delivery, "timeout", &detail, &tail, limit).await?;
        }
        Ok(())
    }

    /// Moves the requests the agent had not started back to the buffer's
    /// front (in order); returns the one it had started, if any.
    fn requeue_unstarted(&mut self) -> Option<Sent> {
        let mut running = None;
        let mut unstarted = Vec::new();
        for sent in self.sent.drain(..) {
            if sent.started.is_some() && running.is_none() {
                running = Some(sent);
            } else {
                unstarted.push(sent.delivery);
            }
        }
        for delivery in unstarted.into_iter().rev() {
            self.buffer.push_front(delivery);
        }
        running
    }

    /// Where this slot's errors outside any test go.
    fn outside(&self) -> OutsideErrors<'_> {
        let shared = &*self.shared;
        OutsideErrors { queue: &*shared.queue, run: &shared.config.run, worker: &shared.config.worker }
    }

    fn untrack(&self, delivery: &Delivery) {
        let mut running = self.shared.running.lock();
        if let Some(at) = running.iter().position(|u| *u == delivery.unit) {
            running.swap_remove(at);
        }
    }

    async fn fail(
        &self,
        delivery: &Delivery,
        reason: &'static str,
        detail: &str,
        output: &str,
        duration: Duration,
    ) -> Result<(), HopperError> {
        let shared = &self.shared;
        let detail = truncate(detail, 1024);
        let output = truncate(output, OUTPUT_MAX);
        requeue_failed(shared, delivery, reason, &detail, &output, duration, self.slot).await?;
        shared.wake.notify_waiters();
        Ok(())
    }

    /// Finalizes the passed tests in one call.
    async fn flush(&mut self) -> Result<(), HopperError> {
        self.last_flush = Instant::now();
        if self.done.is_empty() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let (run, worker) = (&shared.config.run, &shared.config.worker);
        let done = std::mem::take(&mut self.done);
        let items: Vec<(Delivery, FinalizeRequest)> = done.iter().map(|(d, r, _)| (d.clone(), r.clone())).collect();
        shared.held.let_go(done.iter().map(|(d, _, _)| d));
        let replies = shared.queue.finalize_batch(run, worker, &items).await?;
        for ((delivery, request, duration), reply) in done.iter().zip(replies) {
            match reply {
                Ack::Ok => {
                    let (end, reason) = match request.outcome {
                        Outcome::Skipped => (AttemptEnd::Skipped, skips::reason_of(request.errors.as_ref())),
                        _ => (AttemptEnd::Passed, skips::xpass_reason(request.errors.as_ref())),
                    };
                    shared.summary.lock().count(end);
                    shared.observer.attempt_ended(&delivery.unit, end, *duration, reason.as_deref());
                }
                reply => fenced_off(&shared, delivery, "finalize", reply).await,
            }
        }
        shared.summary.lock().invocations += 1;
        shared.wake.notify_waiters();
        Ok(())
    }

    /// Drops the units a beat found lost (another worker owns them now) that
    /// this slot has not sent to its agent, and those of the worker's pool:
    /// they are not run here. (A sent one's result meets `STALE`.)
    fn drop_lost(&mut self) {
        let shared = Arc::clone(&self.shared);
        let mut lost: Vec<Delivery> = self.buffer.iter().filter(|d| shared.held.is_lost(d)).cloned().collect();
        self.buffer.retain(|d| !lost.contains(d));
        for delivery in &lost {
            self.untrack(delivery);
        }
        if let Some(sharding) = &self.command.sharding {
            lost.extend(sharding.pool.lock().forget_lost(|d| shared.held.is_lost(d)));
        }
        shared.held.let_go(&lost);
    }

    /// The build stopped at its failure limit: the units this slot reserved
    /// but has not sent to its agent go back to the queue (they will not
    /// run); those the agent already has finish.
    async fn hand_back_unsent(&mut self) {
        let mut held: Vec<Delivery> = self.buffer.drain(..).collect();
        for delivery in &held {
            self.untrack(delivery);
        }
        if let Some(sharding) = &self.command.sharding {
            held.extend(sharding.pool.lock().drain());
        }
        hand_back(&self.shared, &held, Duration::ZERO).await;
    }

    /// On shutdown, a fatal error or a stop with `--max-failures-kill`:
    /// report what is done, end the agent,
    /// and hand back every unit held (the one it was running was stopped by
    /// us, the others never started) with `release`, which spends no budget.
    async fn give_up(&mut self) {
        if let Err(error) = self.flush().await {
            tracing::warn!(%error, "could not finalize the passed tests on the way out");
        }
        if let Some(agent) = self.agent.take().or_else(|| self.command.spare.take(self.slot)) {
            agent.finish(self.shared.config.limits.kill_grace, true).await;
        }
        let running = self.requeue_unstarted();
        let mut held: Vec<Delivery> = running.into_iter().map(|s| s.delivery).collect();
        held.extend(self.buffer.drain(..));
        for delivery in &held {
            self.untrack(delivery);
        }
        // The worker's pool too: the first slot to stop hands it all back.
        if let Some(sharding) = &self.command.sharding {
            held.extend(sharding.pool.lock().drain());
        }
        if held.is_empty() {
            return;
        }
        hand_back(&self.shared, &held, Duration::ZERO).await;
    }
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[...]{}", &text[start..])
}
