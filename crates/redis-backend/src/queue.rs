//! [`UnitQueue`] on Redis: every transition is one call of the transition
//! script (`lua/transition/`, joined in `scripts.rs`).

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;

use async_trait::async_trait;
use leasehold_core::queue::{DeliveryOrigin, ORPHAN_EVENTS_TTL};
use leasehold_core::{
    Ack, Budgets, Delivery, EntryId, Event, EventId, EventRecord, FinalizeRequest, InitOutcome, LivenessReply,
    PendingDelivery, Progress, QueueError, RequeueReply, RequeueRequest, ReserveBatch, ReserveLimit, RunId, RunLog,
    RunSpec, StreamName, Ttl, UnitGroup, UnitId, UnitQueue, UnitSpec, UnitState, WorkerId, WorkerRecord,
};
use redis::Value;

use crate::conn::Call;
use crate::keys::{RunKeys, QUEUE_FORMAT, SPARSE_STATES};
use crate::reply::{self, ReplyError};
use crate::scripts;
use crate::store::{queue_err, queue_reply_err, RedisStore};

use leasehold_core::duration::millis;

/// JSON of an optional value, or "" for none (the scripts write `null`).
fn json_or_empty<T: serde::Serialize + ?Sized>(value: Option<&T>) -> String {
    value.and_then(|v| serde_json::to_string(v).ok()).unwrap_or_default()
}

/// The event's `slot` field with its leading comma, or "" for none (the
/// field is left out, as serde leaves it out).
fn slot_field(slot: Option<u32>) -> String {
    slot.map(|slot| format!(r#","slot":{slot}"#)).unwrap_or_default()
}

/// One item of a reserve reply.
enum Item {
    Delivered(Delivery),
    Exhausted(UnitId),
}

struct Reserved {
    items: Vec<Item>,
    corrupt: bool,
    /// The run reached its failure limit.
    stopped: bool,
}

fn parse_entry_id(what: &'static str, value: &Value) -> Result<EntryId, ReplyError> {
    let s = reply::string(what, value)?;
    s.parse().map_err(|e| ReplyError::new(what, format!("{e}")))
}

fn parse_stream(what: &'static str, value: &Value) -> Result<StreamName, ReplyError> {
    reply::string(what, value)?.parse().map_err(|e: String| ReplyError::new(what, e))
}

fn parse_unit(what: &'static str, value: &Value) -> Result<UnitId, ReplyError> {
    parse_unit_str(what, &reply::string(what, value)?)
}

fn parse_unit_str(what: &'static str, unit: &str) -> Result<UnitId, ReplyError> {
    UnitId::new(unit).map_err(|e| ReplyError::new(what, e.to_string()))
}

/// The main-stream entry of the unit at `index` of the unit list (format 5:
/// `lua/transition/ranges.lua`).
fn range_entry_id(index: u64) -> EntryId {
    EntryId::new(0, index + 1)
}

/// The units of a range as the chunks pack them, `unit\tkind\n` each:
/// (unit, kind) pairs in order.
fn range_units(packed: &str) -> Result<impl Iterator<Item = (&str, &str)>, String> {
    let Some(body) = packed.strip_suffix('\n') else {
        return Err(format!("range units {packed:?} do not end with a newline"));
    };
    let pairs = body
        .split('\n')
        .map(|line| line.split_once('\t').ok_or_else(|| format!("range unit line {line:?} has no kind")))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(pairs.into_iter())
}

fn parse_reserve(value: Value) -> Result<Reserved, ReplyError> {
    const WHAT: &str = "reserve";
    let items = reply::array(WHAT, value)?;
    let tail = reply::string(WHAT, reply::at(WHAT, &items, 0)?)?;
    let mut out =
        Reserved { items: Vec::with_capacity(items.len() / 5), corrupt: tail == "CORRUPT", stopped: tail == "STOPPED" };
    // Items follow flat: "FRESH", the stream, n and n groups of 5 fields;
    // "OK" and 9 fields; or "FINALIZED" and the unit.
    let mut i = 1;
    while i < items.len() {
        let field = |k: usize| reply::at(WHAT, &items, i + k);
        match reply::string(WHAT, field(0)?)?.as_str() {
            "FRESH" => {
                let stream = parse_stream(WHAT, field(1)?)?;
                let n = reply::uint::<usize>(WHAT, field(2)?)?;
                for k in 0..n {
                    let at = 3 + k * 5;
                    out.items.push(Item::Delivered(Delivery {
                        stream,
                        entry_id: parse_entry_id(WHAT, field(at)?)?,
                        unit: parse_unit(WHAT, field(at + 1)?)?,
                        kind: reply::string(WHAT, field(at + 2)?)?,
                        delivery_count: 1,
                        retry_index: reply::uint(WHAT, field(at + 3)?)?,
                        reclaim_count: reply::uint(WHAT, field(at + 4)?)?,
                        origin: DeliveryOrigin::Fresh,
                    }));
                }
                i += 3 + n * 5;
            }
            "RANGE" => {
                let first = reply::uint::<u64>(WHAT, field(1)?)?;
                let packed = reply::string(WHAT, field(2)?)?;
                for (k, (unit, kind)) in range_units(&packed).map_err(|e| ReplyError::new(WHAT, e))?.enumerate() {
                    out.items.push(Item::Delivered(Delivery {
                        stream: StreamName::Main,
                        entry_id: range_entry_id(first + k as u64),
                        unit: parse_unit_str(WHAT, unit)?,
                        kind: kind.to_owned(),
                        delivery_count: 1,
                        retry_index: 0,
                        reclaim_count: 0,
                        origin: DeliveryOrigin::Fresh,
                    }));
                }
                i += 3;
            }
            "OK" => {
                let reclaimed = reply::int(WHAT, field(8)?)? == 1;
                let origin = if reclaimed {
                    let previous = reply::opt_string(WHAT, field(9)?)?
                        .map(WorkerId::new)
                        .transpose()
                        .map_err(|e| ReplyError::new(WHAT, e.to_string()))?;
                    DeliveryOrigin::Reclaimed { previous_worker: previous }
                } else {
                    DeliveryOrigin::Fresh
                };
                out.items.push(Item::Delivered(Delivery {
                    stream: parse_stream(WHAT, field(1)?)?,
                    entry_id: parse_entry_id(WHAT, field(2)?)?,
                    unit: parse_unit(WHAT, field(3)?)?,
                    kind: reply::string(WHAT, field(4)?)?,
                    delivery_count: reply::uint(WHAT, field(5)?)?,
                    retry_index: reply::uint(WHAT, field(6)?)?,
                    reclaim_count: reply::uint(WHAT, field(7)?)?,
                    origin,
                }));
                i += 10;
            }
            "FINALIZED" => {
                out.items.push(Item::Exhausted(parse_unit(WHAT, field(1)?)?));
                i += 2;
            }
            other => return Err(ReplyError::new(WHAT, format!("unknown item status {other:?}"))),
        }
    }
    Ok(out)
}

/// The stored `max_failures` budget: absent or empty (no limit, or a run
/// stored before the budget existed) is `None`.
fn parse_max_failures(stored: Option<&str>) -> Result<Option<u32>, std::num::ParseIntError> {
    match stored {
        None | Some("") => Ok(None),
        Some(s) => s.parse().map(Some),
    }
}

/// The status string of a `{ STATUS, ... }` reply, and the rest.
fn status(what: &'static str, value: Value) -> Result<(String, Vec<Value>), ReplyError> {
    let mut items = reply::array(what, value)?;
    if items.is_empty() {
        return Err(ReplyError::new(what, "empty reply"));
    }
    let rest = items.split_off(1);
    Ok((reply::string(what, &items[0])?, rest))
}

fn ack(what: &'static str, status: &str) -> Result<Ack, ReplyError> {
    match status {
        "OK" => Ok(Ack::Ok),
        "STALE" => Ok(Ack::Stale),
        "CORRUPT" => Ok(Ack::Corrupt),
        other => Err(ReplyError::new(what, format!("unknown status {other:?}"))),
    }
}

/// The statuses of a batch transition, one per item; a single `CORRUPT`
/// (the run's meta is gone) stands for every item.
fn batch_acks(op: &'static str, run: &RunId, items: usize, value: Value) -> Result<Vec<Ack>, QueueError> {
    let bad = |e| queue_reply_err(op, run, e);
    let statuses = reply::array(op, value).map_err(bad)?;
    let acks = statuses
        .iter()
        .map(|s| reply::string(op, s).and_then(|s| ack(op, &s)).map_err(bad))
        .collect::<Result<Vec<Ack>, QueueError>>()?;
    match acks.as_slice() {
        [Ack::Corrupt] if items > 1 => Ok(vec![Ack::Corrupt; items]),
        _ if acks.len() == items => Ok(acks),
        _ => Err(bad(ReplyError::new(op, format!("{} statuses for {items} items", acks.len())))),
    }
}

/// Worker records as the scripts store them (the seed's JSON shape).
#[derive(serde::Deserialize)]
struct StoredWorker {
    last_seen: u64,
    current_unit: Option<UnitId>,
    processed: u64,
    #[serde(default)]
    left: bool,
}

impl RedisStore {
    /// The unit ids of `run`, whose fingerprint is `fingerprint`: read once
    /// and kept for the last run asked about (a run's unit list never
    /// changes under one fingerprint).
    async fn unit_ids(&self, run: &RunId, fingerprint: String) -> Result<Arc<HashSet<UnitId>>, QueueError> {
        let cached = |cache: &Option<(String, Arc<HashSet<UnitId>>)>| {
            cache.as_ref().filter(|(f, _)| *f == fingerprint).map(|(_, ids)| Arc::clone(ids))
        };
        if let Some(ids) = cached(&self.inner.unit_ids.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(ids);
        }
        let ids: Arc<HashSet<UnitId>> = Arc::new(self.units(run).await?.into_iter().map(|u| u.id).collect());
        *self.inner.unit_ids.lock().unwrap_or_else(|e| e.into_inner()) = Some((fingerprint, Arc::clone(&ids)));
        Ok(ids)
    }

    fn transition(&self, keys: &RunKeys, mode: &str, worker: &WorkerId) -> Call {
        Call::new(keys.all()).arg(mode).arg(worker.as_str())
    }

    fn fenced(&self, keys: &RunKeys, mode: &str, worker: &WorkerId, d: &Delivery) -> Call {
        self.transition(keys, mode, worker)
            .arg(d.stream.as_str())
            .arg(d.entry_id.to_string())
            .arg(d.delivery_count)
            .arg(d.unit.as_str())
    }

    /// Transition `mode` on several deliveries in one call (their count, then
    /// each one's fence fields as [`Self::fenced`] passes them): one status
    /// each, in order. An empty batch costs no round trip.
    async fn fenced_batch(
        &self,
        op: &'static str,
        mode: &str,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<Ack>, QueueError> {
        if deliveries.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = self.transition(&self.run_keys(run), mode, worker).arg(deliveries.len() as u64);
        for d in deliveries {
            call.push(d.stream.as_str());
            call.push(d.entry_id.to_string());
            call.push(d.delivery_count);
            call.push(d.unit.as_str());
        }
        let value = self.run_transition(op, run, &call).await?;
        batch_acks(op, run, deliveries.len(), value)
    }

    async fn run_transition(&self, op: &'static str, run: &RunId, call: &Call) -> Result<Value, QueueError> {
        self.fcall(&scripts::TRANSITION, call).await.map_err(|e| queue_err(op, run, e))
    }

    async fn reserve_items(
        &self,
        run: &RunId,
        worker: &WorkerId,
        max: NonZeroUsize,
        reclaim_after: Ttl,
        single: bool,
    ) -> Result<Reserved, QueueError> {
        let keys = self.run_keys(run);
        let call = self
            .transition(&keys, "reserve", worker)
            .arg(max.get() as u64)
            .arg(reclaim_after.as_millis())
            .arg(if single { "1" } else { "0" });
        let value = self.run_transition("reserve", run, &call).await?;
        parse_reserve(value).map_err(|e| queue_reply_err("reserve", run, e))
    }

    fn finalize_args(call: &mut Call, d: &Delivery, request: &FinalizeRequest) {
        let entry_id = d.entry_id.to_string();
        // The finalized event after its header: nothing the script decides.
        let null_if_empty = |json: String| if json.is_empty() { "null".to_owned() } else { json };
        let tail = format!(
            r#","outcome":"{}","duration_ms":{},"reason":{},"errors":{},"stream":"{}","entry_id":"{}"{}}}"#,
            request.outcome.as_str(),
            request.duration_ms,
            null_if_empty(json_or_empty(request.reason.as_ref().map(|r| r.as_str()).filter(|r| !r.is_empty()))),
            null_if_empty(json_or_empty(request.errors.as_ref())),
            d.stream.as_str(),
            entry_id,
            slot_field(request.slot),
        );
        call.push(d.stream.as_str());
        call.push(entry_id);
        call.push(d.delivery_count);
        call.push(d.unit.as_str());
        call.push(tail);
    }

    /// Finalizes many deliveries of one worker in one script call: the same
    /// replies, events and state as calling [`UnitQueue::finalize`] for each
    /// in order, for a fraction of the Redis CPU (one script set-up, one
    /// worker-record update and one TTL renewal for the whole batch).
    pub async fn finalize_many(
        &self,
        run: &RunId,
        worker: &WorkerId,
        items: &[(Delivery, FinalizeRequest)],
    ) -> Result<Vec<Ack>, QueueError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        for (_, request) in items {
            request.validate()?;
        }
        let keys = self.run_keys(run);
        let mut call = self.transition(&keys, "finalize_batch", worker).arg(items.len() as u64);
        // Spans of nearby entries of each stream: the script reads the
        // fence rows of the batch with one range read per span.
        let runs = fence_spans(items.iter().map(|(d, _)| (d.stream, d.entry_id)));
        call.push(runs.len() as u64);
        for (stream, lo, hi, n) in runs {
            call.push(stream.as_str());
            call.push(lo.to_string());
            call.push(hi.to_string());
            call.push(n);
        }
        for (d, request) in items {
            Self::finalize_args(&mut call, d, request);
        }
        let value = self.run_transition("finalize", run, &call).await?;
        batch_acks("finalize", run, items.len(), value)
    }

    async fn append_prebuilt(
        &self,
        op: &'static str,
        run: &RunId,
        worker: &WorkerId,
        event: serde_json::Value,
    ) -> Result<(), QueueError> {
        let json = serde_json::to_string(&event).map_err(|e| QueueError::backend(op, run, e))?;
        // Drop the closing brace: the script stamps at_ms and closes the object.
        let body = json.strip_suffix('}').unwrap_or(&json).to_owned();
        let keys = self.run_keys(run);
        let call = self.transition(&keys, op, worker).arg(body).arg(millis(ORPHAN_EVENTS_TTL));
        let value = self.run_transition(op, run, &call).await?;
        let (s, _) = status(op, value).map_err(|e| queue_reply_err(op, run, e))?;
        if s != "OK" {
            return Err(queue_reply_err(op, run, ReplyError::new(op, format!("status {s}"))));
        }
        Ok(())
    }

    async fn meta_exists(&self, op: &'static str, run: &RunId, keys: &RunKeys) -> Result<bool, QueueError> {
        let mut conn = self.conn();
        redis::cmd("EXISTS").arg(&keys.meta).query_async::<bool>(&mut conn).await.map_err(|e| queue_err(op, run, e))
    }
}

#[async_trait]
impl UnitQueue for RedisStore {
    async fn initialize(&self, spec: &RunSpec) -> Result<InitOutcome, QueueError> {
        spec.validate()?;
        let run = &spec.run;
        let keys = self.run_keys(run);
        // A nonce makes a re-sent call (after a lost reply) answer INITIALIZED again.
        let nonce = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
        );
        // The format goes first so that either side of a version change sees a
        // fingerprint that differs (see initialize.lua).
        let fingerprint = format!("{}:{}", QUEUE_FORMAT, spec.fingerprint());
        let head = |total: String| {
            Call::new(keys.all())
                .arg(fingerprint.as_str())
                .arg(nonce.as_str())
                .arg(millis(spec.ttl))
                .arg(spec.budgets.max_requeues)
                .arg(spec.budgets.requeue_tolerance.to_string())
                .arg(spec.budgets.max_reclaims)
                .arg(spec.budgets.max_failures.map(|n| n.to_string()).unwrap_or_default())
                .arg(total)
        };
        // A probe without the units first: a worker joining a run that exists
        // (every worker but the leader) does not send, nor make Redis parse,
        // the whole unit list.
        let probe = head("probe".to_owned());
        let value = self.eval(&scripts::INITIALIZE, &probe).await.map_err(|e| queue_err("initialize", run, e))?;
        let bad = |e| queue_reply_err("initialize", run, e);
        let (mut s, mut rest) = status("initialize", value).map_err(bad)?;
        if s == "ABSENT" {
            let mut call = head(spec.units.len().to_string());
            for unit in &spec.units {
                call.push(unit.id.as_str());
                call.push(unit.kind.as_str());
                call.push(unit.group.as_ref().map(|g| format!("{}:{}", g.limit, g.name)).unwrap_or_default());
                call.push(if unit.quarantined { "1" } else { "" });
            }
            let value = self.eval(&scripts::INITIALIZE, &call).await.map_err(|e| queue_err("initialize", run, e))?;
            (s, rest) = status("initialize", value).map_err(bad)?;
        }
        match s.as_str() {
            "INITIALIZED" => Ok(InitOutcome::Initialized),
            "ALREADY" => {
                let field = |i: usize, name: &'static str| -> Result<String, QueueError> {
                    reply::string("initialize", reply::at("initialize", &rest, i).map_err(bad)?).map_err(bad).map_err(
                        |_| QueueError::Corrupt { run: run.clone(), detail: format!("meta field {name} is missing") },
                    )
                };
                let corrupt = |name: &str| QueueError::Corrupt {
                    run: run.clone(),
                    detail: format!("meta field {name} is not a number"),
                };
                let budgets = Budgets {
                    max_requeues: field(0, "max_requeues")?.parse().map_err(|_| corrupt("max_requeues"))?,
                    requeue_tolerance: field(1, "requeue_tolerance")?
                        .parse()
                        .map_err(|_| corrupt("requeue_tolerance"))?,
                    max_reclaims: field(2, "max_reclaims")?.parse().map_err(|_| corrupt("max_reclaims"))?,
                    max_failures: parse_max_failures(field(3, "max_failures").ok().as_deref())
                        .map_err(|_| corrupt("max_failures"))?,
                };
                Ok(InitOutcome::AlreadyInitialized { budgets })
            }
            "MISMATCH" => {
                let existing =
                    reply::uint("initialize", reply::at("initialize", &rest, 0).map_err(bad)?).map_err(bad)?;
                Err(QueueError::UnitListMismatch { run: run.clone(), existing, given: spec.units.len() as u64 })
            }
            "FORMAT" => {
                let found =
                    reply::string("initialize", reply::at("initialize", &rest, 0).map_err(bad)?).map_err(bad)?;
                Err(QueueError::IncompatibleRun { run: run.clone(), found, expected: QUEUE_FORMAT.to_string() })
            }
            other => Err(bad(ReplyError::new("initialize", format!("unknown status {other:?}")))),
        }
    }

    async fn reserve_up_to(
        &self,
        run: &RunId,
        worker: &WorkerId,
        limit: ReserveLimit,
        reclaim_after: Ttl,
    ) -> Result<ReserveBatch, QueueError> {
        // The script's `single` flag ends the call at its first item, a unit
        // finalized over its reclaim budget included (`reserve`'s limit).
        let (max, single) = (limit.max_deliveries(), limit.ends_at_exhausted());
        let reserved = self.reserve_items(run, worker, max, reclaim_after, single).await?;
        let mut batch =
            ReserveBatch { corrupt: reserved.corrupt, stopped: reserved.stopped, ..ReserveBatch::default() };
        for item in reserved.items {
            match item {
                Item::Delivered(d) => batch.deliveries.push(d),
                Item::Exhausted(unit) => batch.exhausted.push(unit),
            }
        }
        Ok(batch)
    }

    async fn heartbeat_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<Ack>, QueueError> {
        self.fenced_batch("heartbeat", "heartbeat_batch", run, worker, deliveries).await
    }

    async fn finalize_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        items: &[(Delivery, FinalizeRequest)],
    ) -> Result<Vec<Ack>, QueueError> {
        self.finalize_many(run, worker, items).await
    }

    async fn requeue(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        request: &RequeueRequest,
    ) -> Result<RequeueReply, QueueError> {
        request.validate()?;
        let keys = self.run_keys(run);
        let call = self
            .fenced(&keys, "requeue", worker, delivery)
            .arg(delivery.kind.as_str())
            .arg(request.duration_ms)
            .arg(json_or_empty(request.failure_summary.as_deref().filter(|s| !s.is_empty())))
            .arg(json_or_empty(request.errors.as_ref()))
            .arg(if request.retry_elsewhere { "1" } else { "0" })
            .arg(slot_field(request.slot));
        let value = self.run_transition("requeue", run, &call).await?;
        let bad = |e| queue_reply_err("requeue", run, e);
        let (s, rest) = status("requeue", value).map_err(bad)?;
        let retry_index = || -> Result<u32, QueueError> {
            reply::uint("requeue", reply::at("requeue", &rest, 0).map_err(bad)?).map_err(bad)
        };
        match s.as_str() {
            "REQUEUED" => Ok(RequeueReply::Requeued { retry_index: retry_index()? }),
            "FINALIZED" => Ok(RequeueReply::Finalized { retry_index: retry_index()? }),
            "STALE" => Ok(RequeueReply::Stale),
            "CORRUPT" => Ok(RequeueReply::Corrupt),
            other => Err(bad(ReplyError::new("requeue", format!("unknown status {other:?}")))),
        }
    }

    async fn abandon(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        elapsed_ms: u64,
    ) -> Result<Ack, QueueError> {
        let keys = self.run_keys(run);
        let call = self.fenced(&keys, "abandoned", worker, delivery).arg(elapsed_ms);
        let value = self.run_transition("abandon", run, &call).await?;
        let (s, _) = status("abandon", value).map_err(|e| queue_reply_err("abandon", run, e))?;
        ack("abandon", &s).map_err(|e| queue_reply_err("abandon", run, e))
    }

    async fn release_batch(
        &self,
        run: &RunId,
        worker: &WorkerId,
        deliveries: &[Delivery],
    ) -> Result<Vec<Ack>, QueueError> {
        self.fenced_batch("release", "release_batch", run, worker, deliveries).await
    }

    async fn liveness(
        &self,
        run: &RunId,
        worker: &WorkerId,
        current_unit: Option<&UnitId>,
    ) -> Result<LivenessReply, QueueError> {
        let keys = self.run_keys(run);
        let call = self.transition(&keys, "liveness", worker).arg(current_unit.map(|u| u.as_str()).unwrap_or(""));
        let value = self.run_transition("liveness", run, &call).await?;
        let (s, _) = status("liveness", value).map_err(|e| queue_reply_err("liveness", run, e))?;
        match s.as_str() {
            "OK" => Ok(LivenessReply::Ok),
            "CORRUPT" => Ok(LivenessReply::Corrupt),
            other => {
                Err(queue_reply_err("liveness", run, ReplyError::new("liveness", format!("unknown status {other:?}"))))
            }
        }
    }

    async fn leave(&self, run: &RunId, worker: &WorkerId) -> Result<LivenessReply, QueueError> {
        let keys = self.run_keys(run);
        let call = self.transition(&keys, "leave", worker);
        let value = self.run_transition("leave", run, &call).await?;
        let (s, _) = status("leave", value).map_err(|e| queue_reply_err("leave", run, e))?;
        match s.as_str() {
            "OK" => Ok(LivenessReply::Ok),
            "CORRUPT" => Ok(LivenessReply::Corrupt),
            other => Err(queue_reply_err("leave", run, ReplyError::new("leave", format!("unknown status {other:?}")))),
        }
    }

    async fn record_worker_error(
        &self,
        run: &RunId,
        worker: &WorkerId,
        unit: Option<&UnitId>,
        message: &str,
    ) -> Result<(), QueueError> {
        leasehold_core::queue::check_worker_error_message(message)?;
        let event = serde_json::json!({
            "type": "worker_error",
            "worker_id": worker,
            "unit_id": unit,
            "message": message,
        });
        self.append_prebuilt("worker_error", run, worker, event).await
    }

    async fn record_stale_rejected(
        &self,
        run: &RunId,
        worker: &WorkerId,
        delivery: &Delivery,
        transition: &str,
    ) -> Result<(), QueueError> {
        let event = serde_json::json!({
            "type": "stale_rejected",
            "worker_id": worker,
            "unit_id": delivery.unit,
            "stream": delivery.stream,
            "entry_id": delivery.entry_id,
            "delivery_count": delivery.delivery_count,
            "transition": transition,
        });
        self.append_prebuilt("stale_rejected", run, worker, event).await
    }
}

#[async_trait]
impl RunLog for RedisStore {
    async fn progress(&self, run: &RunId) -> Result<Option<Progress>, QueueError> {
        let keys = self.run_keys(run);
        let call = Call::new([&keys.units, &keys.priority, &keys.meta, &keys.parked]);
        let value = self.eval(&scripts::PROGRESS, &call).await.map_err(|e| queue_err("progress", run, e))?;
        let bad = |e| queue_reply_err("progress", run, e);
        let items = reply::array("progress", value).map_err(bad)?;
        if items.is_empty() {
            return Ok(None);
        }
        let n = |i| -> Result<u64, QueueError> {
            reply::uint("progress", reply::at("progress", &items, i).map_err(bad)?).map_err(bad)
        };
        Ok(Some(Progress {
            total: n(0)?,
            finalized: n(1)?,
            requeued_units: n(2)?,
            in_flight: n(3)?,
            queued: n(4)?,
            failed: n(5)?,
            stopped: n(6)? == 1,
        }))
    }

    async fn budgets(&self, run: &RunId) -> Result<Option<Budgets>, QueueError> {
        let keys = self.run_keys(run);
        let mut conn = self.conn();
        let values: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&keys.meta)
            .arg(&["ttl_ms", "max_requeues", "requeue_tolerance", "max_reclaims", "max_failures"])
            .query_async(&mut conn)
            .await
            .map_err(|e| queue_err("budgets", run, e))?;
        let [ttl, max_requeues, tolerance, max_reclaims, max_failures]: [Option<String>; 5] = values
            .try_into()
            .map_err(|_| queue_reply_err("budgets", run, ReplyError::new("budgets", "HMGET gave the wrong count")))?;
        if ttl.is_none() {
            return Ok(None);
        }
        let corrupt = |field: &str| QueueError::Corrupt {
            run: run.clone(),
            detail: format!("meta field {field} is missing or not a number"),
        };
        Ok(Some(Budgets {
            max_requeues: max_requeues.and_then(|v| v.parse().ok()).ok_or_else(|| corrupt("max_requeues"))?,
            requeue_tolerance: tolerance.and_then(|v| v.parse().ok()).ok_or_else(|| corrupt("requeue_tolerance"))?,
            max_reclaims: max_reclaims.and_then(|v| v.parse().ok()).ok_or_else(|| corrupt("max_reclaims"))?,
            max_failures: parse_max_failures(max_failures.as_deref()).map_err(|_| corrupt("max_failures"))?,
        }))
    }

    async fn units(&self, run: &RunId) -> Result<Vec<UnitSpec>, QueueError> {
        const PAGE: usize = 10_000;
        let keys = self.run_keys(run);
        if !self.meta_exists("units", run, &keys).await? {
            return Ok(Vec::new());
        }
        let mut conn = self.conn();
        let mut out = Vec::new();
        let mut start = "-".to_owned();
        loop {
            let value: Value = redis::cmd("XRANGE")
                .arg(&keys.units)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(PAGE)
                .query_async(&mut conn)
                .await
                .map_err(|e| queue_err("units", run, e))?;
            let entries = reply::array("units", value).map_err(|e| queue_reply_err("units", run, e))?;
            let n = entries.len();
            for entry in entries {
                let (id, unit, kind, group, quarantined) =
                    stream_entry(entry).map_err(|e| queue_reply_err("units", run, e))?;
                let unit = unit.ok_or_else(|| QueueError::Corrupt {
                    run: run.clone(),
                    detail: format!("main stream entry {id} names no unit"),
                })?;
                out.push(UnitSpec { group, quarantined, ..UnitSpec::new(unit, kind.unwrap_or_default()) });
                start = format!("({id}");
            }
            if n < PAGE {
                return Ok(out);
            }
        }
    }

    async fn unit_state(&self, run: &RunId, unit: &UnitId) -> Result<Option<UnitState>, QueueError> {
        let keys = self.run_keys(run);
        let mut conn = self.conn();
        let (fingerprint, raw, sparse): (Option<String>, Option<String>, bool) = redis::pipe()
            .cmd("HGET")
            .arg(&keys.meta)
            .arg("fingerprint")
            .cmd("HGET")
            .arg(&keys.unit_state)
            .arg(unit.as_str())
            .cmd("HEXISTS")
            .arg(&keys.unit_state)
            .arg(SPARSE_STATES)
            .query_async(&mut conn)
            .await
            .map_err(|e| queue_err("unit_state", run, e))?;
        match (fingerprint, raw) {
            (Some(_), Some(raw)) => serde_json::from_str(&raw).map(Some).map_err(|e| QueueError::Corrupt {
                run: run.clone(),
                detail: format!("unit_state of {unit:?} is not valid ({e}): {raw:?}"),
            }),
            // Only changed states are stored: a unit of the run without one is fresh.
            (Some(fingerprint), None) if sparse => {
                Ok(self.unit_ids(run, fingerprint).await?.contains(unit).then(UnitState::default))
            }
            _ => Ok(None),
        }
    }

    async fn events(&self, run: &RunId, after: Option<EventId>, limit: usize) -> Result<Vec<EventRecord>, QueueError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let keys = self.run_keys(run);
        let mut conn = self.conn();
        // Event <ms>-<seq * 65536 + index> is event `index` of entry <ms>-<seq>:
        // start at the entry of `after` (inclusive: it may hold later events).
        let mut start = after.map_or_else(|| "-".to_owned(), |a| format!("{}-{}", a.ms, a.seq >> EVENT_INDEX_BITS));
        let mut out = Vec::with_capacity(limit.min(10_000));
        // An entry packs the events of one call (a batch's finalizes, say),
        // so asking for `limit` entries would read many times what is kept
        // (a whole 20,000-unit log for 1,000 events): the first read takes a
        // few entries, and each next one about as many as are still wanted,
        // by the events per entry seen so far.
        const FIRST_READ: usize = 16;
        let (mut entries_seen, mut events_seen) = (0usize, 0usize);
        loop {
            let page = if entries_seen == 0 {
                FIRST_READ
            } else {
                let per_entry = events_seen.div_ceil(entries_seen).max(1);
                ((limit - out.len()).div_ceil(per_entry) + 1).clamp(FIRST_READ, 10_000)
            };
            let value: Value = redis::cmd("XRANGE")
                .arg(&keys.attempts)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(page)
                .query_async(&mut conn)
                .await
                .map_err(|e| queue_err("events", run, e))?;
            let entries = reply::array("events", value).map_err(|e| queue_reply_err("events", run, e))?;
            let n = entries.len();
            for entry in entries {
                let (id, events) = attempts_entry(run, entry)?;
                start = format!("({id}");
                entries_seen += 1;
                events_seen += events.len();
                for (index, event) in events.into_iter().enumerate() {
                    let event_id = EventId::new(id.ms, (id.seq << EVENT_INDEX_BITS) | index as u64);
                    if after.is_some_and(|a| event_id <= a) {
                        continue;
                    }
                    out.push(EventRecord { id: event_id, event });
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            if n < page {
                return Ok(out);
            }
        }
    }

    async fn wait_for_events(
        &self,
        run: &RunId,
        after: Option<EventId>,
        timeout: std::time::Duration,
    ) -> Result<Option<EventId>, QueueError> {
        crate::wait::wait_for_events(self, run, after, timeout).await
    }

    async fn workers(&self, run: &RunId) -> Result<Vec<WorkerRecord>, QueueError> {
        let keys = self.run_keys(run);
        let mut conn = self.conn();
        let raw: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&keys.workers)
            .query_async(&mut conn)
            .await
            .map_err(|e| queue_err("workers", run, e))?;
        let mut out = Vec::with_capacity(raw.len());
        for (worker, json) in raw {
            let stored: StoredWorker = serde_json::from_str(&json).map_err(|e| QueueError::Corrupt {
                run: run.clone(),
                detail: format!("worker record of {worker:?} is not valid ({e}): {json:?}"),
            })?;
            let worker = WorkerId::new(&worker)
                .map_err(|e| QueueError::Corrupt { run: run.clone(), detail: format!("worker record: {e}") })?;
            out.push(WorkerRecord {
                worker,
                last_seen_ms: stored.last_seen,
                current_unit: stored.current_unit,
                processed: stored.processed,
                left: stored.left,
            });
        }
        out.sort_by(|a, b| a.worker.cmp(&b.worker));
        Ok(out)
    }

    async fn pending(&self, run: &RunId) -> Result<Vec<PendingDelivery>, QueueError> {
        const WHAT: &str = "pending";
        let keys = self.run_keys(run);
        let call = Call::new([&keys.units, &keys.priority, &keys.chunks, &keys.ranges, &keys.clocks]);
        let value = self.eval(&scripts::PENDING, &call).await.map_err(|e| queue_err(WHAT, run, e))?;
        let bad = |e| queue_reply_err(WHAT, run, e);
        let rows = reply::array(WHAT, value).map_err(bad)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let f = reply::array(WHAT, row).map_err(bad)?;
            let get = |i| reply::at(WHAT, &f, i).map_err(bad);
            let entry_id = parse_entry_id(WHAT, get(1)?).map_err(bad)?;
            let unit = reply::opt_string(WHAT, get(2)?).map_err(bad)?.ok_or_else(|| QueueError::Corrupt {
                run: run.clone(),
                detail: format!("pending entry {entry_id} is not in its stream"),
            })?;
            out.push(PendingDelivery {
                stream: parse_stream(WHAT, get(0)?).map_err(bad)?,
                entry_id,
                unit: UnitId::new(unit).map_err(|e| bad(ReplyError::new(WHAT, e.to_string())))?,
                worker: WorkerId::new(reply::string(WHAT, get(3)?).map_err(bad)?)
                    .map_err(|e| bad(ReplyError::new(WHAT, e.to_string())))?,
                idle_ms: reply::uint(WHAT, get(4)?).map_err(bad)?,
                delivery_count: reply::uint(WHAT, get(5)?).map_err(bad)?,
            });
        }
        Ok(out)
    }
}

/// The most entries a span may pass over between two of the batch's own.
/// The entries of one reserve call are adjacent, but a slot that shares its
/// reserves with the worker's other slots (agents sharded by file) finalizes
/// every other one or so: a read of its own would cost each of those an
/// XPENDING and an XRANGE, while a span returns a passed-over entry for a
/// small fraction of that (XPENDING of one consumer returns only its own).
const MAX_SPAN_GAP: u64 = 8;

/// The entries as spans of one stream and millisecond, as (stream, lowest,
/// highest, length): an entry joins the span before it when no more than
/// [`MAX_SPAN_GAP`] ids can lie between them (main-stream entries share a
/// millisecond and take consecutive sequence numbers). `length` counts every
/// id the span can hold, so reading that many from its lowest id returns
/// all of them. Duplicates are dropped.
fn fence_spans(entries: impl Iterator<Item = (StreamName, EntryId)>) -> Vec<(StreamName, EntryId, EntryId, u64)> {
    let mut sorted: Vec<(StreamName, EntryId)> = entries.collect();
    sorted.sort_by_key(|(stream, id)| (stream.as_str(), *id));
    sorted.dedup();
    let mut spans: Vec<(StreamName, EntryId, EntryId, u64)> = Vec::new();
    for (stream, id) in sorted {
        match spans.last_mut() {
            Some((s, lo, hi, n))
                if *s == stream && hi.ms == id.ms && id.seq.saturating_sub(hi.seq) <= MAX_SPAN_GAP + 1 =>
            {
                *hi = id;
                *n = id.seq - lo.seq + 1;
            }
            _ => spans.push((stream, id, id, 1)),
        }
    }
    spans
}

/// Bits of an [`EventId`]'s seq that hold the event's index in its entry.
pub(crate) const EVENT_INDEX_BITS: u32 = 16;

/// An entry of the attempts stream as (entry id, its events in order): a
/// `json` field holds one event, a `batch` field a JSON array of events, and
/// a `packed` entry the tokens of `lua/transition/events.lua`.
pub(crate) fn attempts_entry(run: &RunId, entry: Value) -> Result<(EntryId, Vec<Event>), QueueError> {
    let bad = |e| queue_reply_err("events", run, e);
    let items = reply::array("events", entry).map_err(bad)?;
    let id = parse_entry_id("events", reply::at("events", &items, 0).map_err(bad)?).map_err(bad)?;
    let fields = reply::array("events", items.into_iter().nth(1).unwrap_or(Value::Nil)).map_err(bad)?;
    let corrupt = |what: &str, e: serde_json::Error, json: &str| QueueError::Corrupt {
        run: run.clone(),
        detail: format!("event {id} is not a valid {what} ({e}): {json}"),
    };
    let tokens = fields
        .iter()
        .map(|v| reply::opt_string("events", v).map(Option::unwrap_or_default))
        .collect::<Result<Vec<String>, ReplyError>>()
        .map_err(bad)?;
    let events = match tokens.first().map(String::as_str) {
        Some("json") if tokens.len() >= 2 => {
            vec![serde_json::from_str(&tokens[1]).map_err(|e| corrupt("event", e, &tokens[1]))?]
        }
        Some("batch") if tokens.len() >= 2 => {
            serde_json::from_str(&tokens[1]).map_err(|e| corrupt("event batch", e, &tokens[1]))?
        }
        Some("packed") => unpack_events(&tokens).map_err(|detail| QueueError::Corrupt {
            run: run.clone(),
            detail: format!("event entry {id}: {detail}"),
        })?,
        _ => return Err(QueueError::Corrupt { run: run.clone(), detail: format!("event {id} has no json field") }),
    };
    if events.len() > 1 << EVENT_INDEX_BITS {
        return Err(QueueError::Corrupt {
            run: run.clone(),
            detail: format!("event batch {id} holds {} events", events.len()),
        });
    }
    Ok((id, events))
}

/// The events of a packed attempts entry (`lua/transition/events.lua`):
/// "packed", worker, "at_ms", at_ms, then "R" first packed (a range's fresh
/// deliveries, format 5), "S" stream state n and n pairs of
/// unit and entry_id (n fresh deliveries), or per event "D" unit stream
/// entry_id state (one, as format 3 wrote them), "F" unit state tail, or "J"
/// json (a lone "" pads the last pair).
/// Each is rebuilt as the JSON the script wrote before events were packed.
fn unpack_events(tokens: &[String]) -> Result<Vec<Event>, String> {
    let [_, worker, at_label, at_ms, rest @ ..] = tokens else { return Err("no packed header".into()) };
    if at_label != "at_ms" || at_ms.parse::<u64>().is_err() {
        return Err(format!("bad packed header at_ms {at_ms:?}"));
    }
    let worker_json = serde_json::to_string(worker).map_err(|e| e.to_string())?;
    let head = |kind: &str, unit: &str, state: &str| -> Result<String, String> {
        let (r, c) = state.split_once(':').ok_or_else(|| format!("bad state {state:?}"))?;
        let (r, c): (u64, u64) = (
            r.parse().map_err(|_| format!("bad state {state:?}"))?,
            c.parse().map_err(|_| format!("bad state {state:?}"))?,
        );
        let unit_json = serde_json::to_string(unit).map_err(|e| e.to_string())?;
        Ok(format!(
            r#"{{"type":"{kind}","unit_id":{unit_json},"worker_id":{worker_json},"retry_index":{r},"reclaim_count":{c},"ownership_generation":{},"at_ms":{at_ms}"#,
            1 + r + c
        ))
    };
    let parse = |json: &str| serde_json::from_str::<Event>(json).map_err(|e| format!("bad event ({e}): {json}"));
    let mut out = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        match rest[i].as_str() {
            "D" => {
                let [unit, stream, entry_id, state] = event_tokens::<4>(rest, i)?;
                let json = head("delivered", unit, state)?
                    + &format!(r#","stream":"{stream}","entry_id":"{entry_id}","delivery_count":1}}"#);
                out.push(parse(&json)?);
                i += 5;
            }
            "S" => {
                let [stream, state, n] = event_tokens::<3>(rest, i)?;
                let n: usize = n.parse().map_err(|_| format!("bad delivered run length {n:?}"))?;
                let pairs = rest.get(i + 4..i + 4 + 2 * n).ok_or("truncated delivered run")?;
                for pair in pairs.chunks_exact(2) {
                    let json = head("delivered", &pair[0], state)?
                        + &format!(r#","stream":"{stream}","entry_id":"{}","delivery_count":1}}"#, pair[1]);
                    out.push(parse(&json)?);
                }
                i += 4 + 2 * n;
            }
            "R" => {
                let [first, packed] = event_tokens::<2>(rest, i)?;
                let first: u64 = first.parse().map_err(|_| format!("bad range start {first:?}"))?;
                for (k, (unit, _)) in range_units(packed)?.enumerate() {
                    let entry_id = range_entry_id(first + k as u64);
                    let json = head("delivered", unit, "0:0")?
                        + &format!(r#","stream":"units","entry_id":"{entry_id}","delivery_count":1}}"#);
                    out.push(parse(&json)?);
                }
                i += 3;
            }
            "F" => {
                let [unit, state, tail] = event_tokens::<3>(rest, i)?;
                out.push(parse(&(head("finalized", unit, state)? + tail))?);
                i += 4;
            }
            "J" => {
                let [json] = event_tokens::<1>(rest, i)?;
                out.push(parse(json)?);
                i += 2;
            }
            "" if i + 1 == rest.len() => i += 1,
            other => return Err(format!("unknown event token {other:?}")),
        }
    }
    Ok(out)
}

/// The `N` tokens after the tag at `at`.
fn event_tokens<const N: usize>(tokens: &[String], at: usize) -> Result<&[String; N], String> {
    tokens
        .get(at + 1..at + 1 + N)
        .and_then(|t| <&[String; N]>::try_from(t).ok())
        .ok_or_else(|| format!("truncated {:?} event", tokens[at]))
}

/// A stream entry as (id, unit, kind): one field, the unit id valued its
/// kind; or, written before that format, fields `id` and `type`.
/// A main-stream entry: its id, unit, kind, group and whether it is quarantined.
type StreamEntry = (EntryId, Option<UnitId>, Option<String>, Option<UnitGroup>, bool);

fn stream_entry(entry: Value) -> Result<StreamEntry, ReplyError> {
    const WHAT: &str = "stream entry";
    let items = reply::array(WHAT, entry)?;
    let id = parse_entry_id(WHAT, reply::at(WHAT, &items, 0)?)?;
    let fields = reply::array(WHAT, items.into_iter().nth(1).unwrap_or(Value::Nil))?;
    if let [unit, kind] = fields.as_slice() {
        return Ok((id, Some(parse_unit(WHAT, unit)?), Some(reply::string(WHAT, kind)?), None, false));
    }
    // The unit valued its kind, then fields named from byte 1 (`\x01group`).
    if let [unit, kind, extra @ ..] = fields.as_slice() {
        let first = reply::string(WHAT, &extra[0])?;
        if first.starts_with('\x01') {
            let (mut group, mut quarantined) = (None, false);
            for kv in extra.chunks(2) {
                if let [name, value] = kv {
                    match reply::string(WHAT, name)?.as_str() {
                        "\x01group" => group = Some(parse_group(WHAT, &reply::string(WHAT, value)?)?),
                        "\x01quarantined" => quarantined = true,
                        _ => {}
                    }
                }
            }
            return Ok((id, Some(parse_unit(WHAT, unit)?), Some(reply::string(WHAT, kind)?), group, quarantined));
        }
    }
    let (mut unit, mut kind) = (None, None);
    for kv in fields.chunks(2) {
        if kv.len() < 2 {
            continue;
        }
        match reply::string(WHAT, &kv[0])?.as_str() {
            "id" => unit = Some(parse_unit(WHAT, &kv[1])?),
            "type" => kind = Some(reply::string(WHAT, &kv[1])?),
            _ => {}
        }
    }
    Ok((id, unit, kind, None, false))
}

/// A stored group field, `<limit>:<name>`.
fn parse_group(what: &'static str, field: &str) -> Result<UnitGroup, ReplyError> {
    let bad = || ReplyError::new(what, format!("group field {field:?} is not <limit>:<name>"));
    let (limit, name) = field.split_once(':').ok_or_else(bad)?;
    let limit = limit.parse().map_err(|_| bad())?;
    Ok(UnitGroup { name: name.to_owned(), limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, fields: &[&str]) -> Value {
        Value::Array(vec![bulk(id), Value::Array(fields.iter().map(|f| bulk(f)).collect())])
    }

    #[test]
    fn a_run_stored_without_max_failures_has_no_limit() {
        assert_eq!(parse_max_failures(None), Ok(None));
        assert_eq!(parse_max_failures(Some("")), Ok(None));
        assert_eq!(parse_max_failures(Some("3")), Ok(Some(3)));
        assert!(parse_max_failures(Some("x")).is_err());
    }

    #[test]
    fn stream_entries_of_both_formats_read_alike() {
        let new = stream_entry(entry("5-1", &["tests/a.py::t[x y]", "test"])).unwrap();
        let old = stream_entry(entry("5-1", &["id", "tests/a.py::t[x y]", "type", "test"])).unwrap();
        assert_eq!(new, old);
        let unit = Some(UnitId::new("tests/a.py::t[x y]").unwrap());
        assert_eq!(new, (EntryId::new(5, 1), unit.clone(), Some("test".into()), None, false));
        let grouped = stream_entry(entry("5-1", &["tests/a.py::t[x y]", "test", "\x01group", "2:pg:main"])).unwrap();
        let group = UnitGroup { name: "pg:main".into(), limit: std::num::NonZeroU32::new(2).unwrap() };
        assert_eq!(grouped, (EntryId::new(5, 1), unit, Some("test".into()), Some(group), false));
        // A unit named like a field name is still the unit of a one-field entry.
        let named_id = stream_entry(entry("5-2", &["id", "type"])).unwrap();
        assert_eq!((named_id.1.unwrap().as_str(), named_id.2.as_deref()), ("id", Some("type")));
    }

    #[test]
    fn packed_events_read_as_the_json_they_replace() {
        let run = RunId::new("r").unwrap();
        let head = |kind: &str, unit: &str, r: u32, c: u32| {
            format!(
                r#"{{"type":"{kind}","unit_id":{},"worker_id":"w\"1","retry_index":{r},"reclaim_count":{c},"ownership_generation":{},"at_ms":1700"#,
                serde_json::to_string(unit).unwrap(),
                1 + r + c
            )
        };
        let tail =
            r#","outcome":"passed","duration_ms":7,"reason":null,"errors":null,"stream":"units","entry_id":"5-1"}"#;
        let delivered =
            head("delivered", "u\"1", 0, 0) + r#","stream":"units:priority","entry_id":"5-1","delivery_count":1}"#;
        let finalized = head("finalized", "u\"1", 2, 1) + tail;
        let released = head("released", "u2", 0, 0) + r#","stream":"units","entry_id":"5-2","new_entry_id":"6-0"}"#;
        let as_json = serde_json::to_string(
            &[&delivered, &finalized, &released].map(|j| serde_json::from_str::<serde_json::Value>(j).unwrap()),
        )
        .unwrap();
        let (_, batch) = attempts_entry(&run, entry("9-0", &["batch", &as_json])).unwrap();
        let tokens = [
            "packed",
            "w\"1",
            "at_ms",
            "1700",
            "D",
            "u\"1",
            "units:priority",
            "5-1",
            "0:0",
            "F",
            "u\"1",
            "2:1",
            tail,
            "J",
            &released,
            "",
        ];
        let (id, packed) = attempts_entry(&run, entry("9-0", &tokens)).unwrap();
        assert_eq!(id, EntryId::new(9, 0));
        assert_eq!(packed, batch);
        assert_eq!(packed.len(), 3);
        let (_, single) = attempts_entry(&run, entry("9-1", &["json", &released])).unwrap();
        assert_eq!(single, vec![batch[2].clone()]);

        // A run of fresh deliveries (format 4) reads as one `delivered` event a pair.
        let second =
            head("delivered", "u2", 0, 0) + r#","stream":"units:priority","entry_id":"5-2","delivery_count":1}"#;
        let runs = serde_json::to_string(
            &[&delivered, &second, &finalized].map(|j| serde_json::from_str::<serde_json::Value>(j).unwrap()),
        )
        .unwrap();
        let (_, expected) = attempts_entry(&run, entry("9-3", &["batch", &runs])).unwrap();
        let tokens = [
            "packed",
            "w\"1",
            "at_ms",
            "1700",
            "S",
            "units:priority",
            "0:0",
            "2",
            "u\"1",
            "5-1",
            "u2",
            "5-2",
            "F",
            "u\"1",
            "2:1",
            tail,
        ];
        assert_eq!(attempts_entry(&run, entry("9-3", &tokens)).unwrap().1, expected);

        // A range's fresh deliveries (format 5) read as one `delivered` event a unit.
        let range_events = [("u\"1", "0-8"), ("u 2", "0-9")]
            .map(|(unit, id)| {
                head("delivered", unit, 0, 0) + &format!(r#","stream":"units","entry_id":"{id}","delivery_count":1}}"#)
            })
            .map(|j| serde_json::from_str::<serde_json::Value>(&j).unwrap());
        let (_, expected) =
            attempts_entry(&run, entry("9-4", &["batch", &serde_json::to_string(&range_events).unwrap()])).unwrap();
        let tokens = ["packed", "w\"1", "at_ms", "1700", "R", "7", "u\"1\tfile\nu 2\t\n", ""];
        assert_eq!(attempts_entry(&run, entry("9-4", &tokens)).unwrap().1, expected);

        for bad in [
            &["packed", "w", "at_ms"][..],
            &["packed", "w", "at_ms", "1", "R", "7", "u\tfile"],
            &["packed", "w", "at_ms", "1", "R", "7", "u\n"],
            &["packed", "w", "at_ms", "1", "R", "x", "u\tfile\n"],
            &["packed", "w", "at_ms", "1", "R", "7"],
            &["packed", "w", "at_ms", "1", "D", "u"],
            &["packed", "w", "at_ms", "1", "S", "units", "0:0", "2", "u", "5-1"],
            &["packed", "w", "at_ms", "1", "S", "units", "0:0", "x"],
            &["packed", "w", "at_ms", "1", "X"],
        ] {
            assert!(matches!(attempts_entry(&run, entry("9-2", bad)), Err(QueueError::Corrupt { .. })), "{bad:?}");
        }
    }

    #[test]
    fn a_range_reads_as_fresh_deliveries_of_consecutive_main_entries() {
        let reply = Value::Array(vec![
            bulk("FULL"),
            bulk("RANGE"),
            Value::Int(41),
            bulk("a b\tfile\nc\t\n"),
            bulk("FINALIZED"),
            bulk("z"),
        ]);
        let reserved = parse_reserve(reply).unwrap();
        let delivered: Vec<_> = reserved
            .items
            .iter()
            .filter_map(|item| match item {
                Item::Delivered(d) => Some((d.unit.as_str(), d.kind.as_str(), d.entry_id, d.stream, d.delivery_count)),
                Item::Exhausted(_) => None,
            })
            .collect();
        assert_eq!(
            delivered,
            [
                ("a b", "file", EntryId::new(0, 42), StreamName::Main, 1),
                ("c", "", EntryId::new(0, 43), StreamName::Main, 1)
            ]
        );
        assert_eq!(reserved.items.len(), 3);
        for bad in ["a\tfile", "a\n", "a\tfile\nb\n"] {
            let reply = Value::Array(vec![bulk("FULL"), bulk("RANGE"), Value::Int(0), bulk(bad)]);
            assert!(parse_reserve(reply).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fence_spans_split_at_wide_gaps_streams_and_milliseconds() {
        let main = StreamName::Main;
        let prio = StreamName::Priority;
        let e = EntryId::new;
        let spans = fence_spans(
            [
                (main, e(5, 3)),
                (main, e(5, 1)),
                (prio, e(5, 2)),
                (main, e(5, 2)),
                (main, e(5, 2)),
                // Eight ids passed over: still one span, which counts them.
                (main, e(5, 12)),
                (main, e(6, 0)),
                // Nine: a span of its own.
                (main, e(5, 22)),
                (main, e(5, 23)),
            ]
            .into_iter(),
        );
        assert_eq!(
            spans,
            vec![
                (main, e(5, 1), e(5, 12), 12),
                (main, e(5, 22), e(5, 23), 2),
                (main, e(6, 0), e(6, 0), 1),
                (prio, e(5, 2), e(5, 2), 1),
            ]
        );
        assert!(fence_spans(std::iter::empty()).is_empty());
    }
}
