//! Redis-side figures shared by the Redis benchmarks: the server's CPU time
//! (`INFO cpu`), its idle rate, and the per-command breakdown (`INFO
//! commandstats`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use redis::aio::MultiplexedConnection;
use redis::Value;

/// The redis-server process's CPU time so far (user + system), in seconds.
pub async fn cpu_s(conn: &mut MultiplexedConnection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    Ok(info
        .lines()
        .filter_map(|l| l.strip_prefix("used_cpu_sys:").or_else(|| l.strip_prefix("used_cpu_user:")))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum())
}

/// The server's CPU rate when nobody calls it (its timers), in CPU seconds
/// per second, measured over `over`.
pub async fn idle_rate(conn: &mut MultiplexedConnection, over: Duration) -> Result<f64> {
    let c0 = cpu_s(conn).await?;
    tokio::time::sleep(over).await;
    Ok((cpu_s(conn).await? - c0) / over.as_secs_f64())
}

/// One line of `INFO commandstats`.
#[derive(Debug, Clone)]
pub struct CommandStat {
    /// The command (`evalsha`, `xadd`, ...; script inner commands included).
    pub name: String,
    /// Calls since the last `CONFIG RESETSTAT`.
    pub calls: u64,
    /// Time spent in the command, µs (a script's includes its inner commands).
    pub usec: u64,
}

/// `INFO commandstats`, the most expensive command first.
pub async fn commandstats(conn: &mut MultiplexedConnection) -> Result<Vec<CommandStat>> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    let mut out = Vec::new();
    for line in info.lines() {
        let Some((name, stats)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
        let field = |key: &str| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        out.push(CommandStat { name: name.to_owned(), calls: field("calls") as u64, usec: field("usec") as u64 });
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.usec));
    Ok(out)
}

/// Resets `INFO commandstats` (and the other `CONFIG RESETSTAT` counters).
pub async fn reset_stats(conn: &mut MultiplexedConnection) -> Result<()> {
    redis::cmd("CONFIG").arg("RESETSTAT").query_async::<()>(conn).await?;
    Ok(())
}

/// Prints the per-command breakdown, per unit: calls and µs. Commands a
/// script runs are counted both on their own line and inside the script's.
pub fn print_commandstats(stats: &[CommandStat], units: f64) {
    println!("  Redis commands per unit (calls, µs; commands inside scripts count on their own line too):");
    for s in stats.iter().filter(|s| s.name != "info" && s.name != "config" && s.name != "slowlog").take(16) {
        println!(
            "    {:<22} {:>9} calls {:>7.3}/unit {:>7.2} µs/unit",
            s.name,
            s.calls,
            s.calls as f64 / units,
            s.usec as f64 / units
        );
    }
}

/// The breakdown as JSON: command → {calls, us_per_unit}.
pub fn commandstats_json(stats: &[CommandStat], units: f64) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for s in stats.iter().filter(|s| s.name != "info" && s.name != "config" && s.name != "slowlog") {
        map.insert(
            s.name.clone(),
            serde_json::json!({"calls": s.calls, "us_per_unit": crate::hopper_local::round3(s.usec as f64 / units)}),
        );
    }
    serde_json::Value::Object(map)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Whether a script's first argument is a mode name (`reserve`,
/// `finalize_batch`, ...), not data.
fn is_mode_name(arg: &str) -> bool {
    !arg.is_empty() && arg.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

/// One call in the slow log: what ran (see [`slowlog_by_mode`]), the
/// client's address (`ip:port`) and its execution time in µs.
#[derive(Debug, Clone)]
pub struct SlowCall {
    pub label: String,
    pub client: String,
    pub us: u64,
}

impl SlowCall {
    /// Whether a client sent it, rather than a script running it (Redis logs
    /// a script's inner commands under the address `?:0`, and their time is
    /// inside the script's own entry too).
    pub fn top_level(&self) -> bool {
        self.client != "?:0"
    }
}

/// The whole slow log, the bench's own reads (`SLOWLOG`, `INFO`, `CONFIG`,
/// `CLIENT`) left out.
pub async fn slowlog(conn: &mut MultiplexedConnection) -> Result<Vec<SlowCall>> {
    let entries: Vec<Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query_async(conn).await?;
    let mut out = Vec::new();
    for entry in entries {
        let Value::Array(fields) = entry else { continue };
        let (Some(Value::Int(us)), Some(Value::Array(args))) = (fields.get(2), fields.get(3)) else { continue };
        let client = fields.get(4).and_then(text).unwrap_or_default();
        let args: Vec<String> = args.iter().filter_map(text).collect();
        let command = args.first().map(|a| a.to_ascii_lowercase()).unwrap_or_default();
        let label = if command == "evalsha" || command == "eval" || command == "fcall" {
            // EVALSHA sha numkeys key... mode ...: the transition script's
            // first argument names its mode, whatever its number of keys.
            let keys = args.get(2).and_then(|n| n.parse::<usize>().ok());
            match keys.map(|n| (n, args.get(3 + n))) {
                Some((_, Some(mode))) if is_mode_name(mode) => mode.clone(),
                Some((n, _)) => format!("script/{n} keys"),
                None => "script".into(),
            }
        } else {
            command
        };
        if matches!(label.as_str(), "slowlog" | "info" | "config" | "client") {
            continue;
        }
        out.push(SlowCall { label, client, us: *us as u64 });
    }
    Ok(out)
}

/// The slow log grouped by what ran: the transition mode for the transition
/// script, "script/<n> keys" for other scripts, else the command.
/// Values: (calls, µs).
pub async fn slowlog_by_mode(conn: &mut MultiplexedConnection) -> Result<BTreeMap<String, (u64, u64)>> {
    Ok(group(slowlog(conn).await?.iter().map(|c| (c.label.clone(), c.us))))
}

/// (calls, µs) per key.
pub fn group(calls: impl Iterator<Item = (String, u64)>) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (key, us) in calls {
        let slot = out.entry(key).or_default();
        slot.0 += 1;
        slot.1 += us;
    }
    out
}

/// The addresses (`ip:port`) of the server's connected clients.
pub async fn client_addrs(conn: &mut MultiplexedConnection) -> Result<BTreeSet<String>> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query_async(conn).await?;
    Ok(list
        .lines()
        .filter_map(|line| line.split(' ').find_map(|kv| kv.strip_prefix("addr=")))
        .map(str::to_owned)
        .collect())
}
