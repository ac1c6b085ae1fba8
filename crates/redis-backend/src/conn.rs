//! The connection: one server or a cluster, behind one type, plus script
//! calls that reload their script on `NOSCRIPT` (single and pipelined), and
//! function calls that load their library when Redis has lost it.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Script, ServerErrorKind, Value};

use crate::config::{ConnectError, RedisConfig};
use crate::scripts::Library;

/// A reconnecting connection to one server or to a cluster. Cheap to clone;
/// clones share the underlying multiplexed connection, so concurrent calls
/// are pipelined on the wire.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conn::Single(_) => f.write_str("Conn::Single"),
            Conn::Cluster(_) => f.write_str("Conn::Cluster"),
        }
    }
}

impl Conn {
    /// Connects as `config` says.
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Self, ConnectError> {
        if config.url.starts_with("rediss") {
            // rustls picks a provider on its own only when exactly one is
            // compiled in; say which, so another crate's choice cannot make
            // rediss:// panic. Already installed (by us or the app) is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let connect_err = |source| ConnectError::Connect { url: config.url.clone(), source };
        if config.is_cluster() {
            let nodes = config.node_urls()?;
            let client = ClusterClientBuilder::new(nodes)
                .connection_timeout(config.connection_timeout)
                .response_timeout(config.response_timeout)
                .build()
                .map_err(|e| ConnectError::BadUrl { url: config.url.clone(), detail: e.to_string() })?;
            let conn = client.get_async_connection().await.map_err(connect_err)?;
            Ok(Conn::Cluster(conn))
        } else {
            let client = redis::Client::open(config.url.as_str())
                .map_err(|e| ConnectError::BadUrl { url: config.url.clone(), detail: e.to_string() })?;
            let manager_config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(config.response_timeout))
                .set_connection_timeout(Some(config.connection_timeout))
                .set_number_of_retries(2)
                .set_max_delay(std::time::Duration::from_secs(2));
            let manager = ConnectionManager::new_with_config(client, manager_config).await.map_err(connect_err)?;
            Ok(Conn::Single(manager))
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// One script call: keys and arguments.
#[derive(Debug, Default, Clone)]
pub(crate) struct Call {
    pub keys: Vec<String>,
    pub args: Vec<Vec<u8>>,
}

impl Call {
    /// A call on `keys`.
    pub(crate) fn new<K: AsRef<str>>(keys: impl IntoIterator<Item = K>) -> Self {
        Self { keys: keys.into_iter().map(|k| k.as_ref().to_owned()).collect(), args: Vec::new() }
    }

    /// Adds an argument.
    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// Adds an argument in place.
    pub(crate) fn push(&mut self, arg: impl redis::ToRedisArgs) {
        arg.write_redis_args(&mut self.args);
    }

    /// `command target numkeys keys... args...` (`EVALSHA` and `FCALL` take
    /// the same shape).
    fn command(&self, command: &str, target: &str) -> Cmd {
        let mut cmd = redis::cmd(command);
        cmd.arg(target).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(k);
        }
        for a in &self.args {
            cmd.arg(a.as_slice());
        }
        cmd
    }

    fn fcall(&self, library: &Library) -> Cmd {
        self.command("FCALL", library.name())
    }

    fn evalsha(&self, script: &Script) -> Cmd {
        self.command("EVALSHA", script.get_hash())
    }
}

fn is_noscript(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

fn value_is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

/// Loads `script` (on every node of a cluster).
async fn load(conn: &mut Conn, script: &Script) -> RedisResult<()> {
    script.prepare_invoke().load_async(conn).await.map(|_| ())
}

/// Runs `script` as `EVALSHA`; on `NOSCRIPT` loads it and runs it again.
/// Whether Redis said it has no function of the name called (never loaded,
/// or lost with a restart or a `FUNCTION FLUSH`).
fn is_missing_function(err: &RedisError) -> bool {
    err.to_string().contains("Function not found")
}

/// Loads `library` (every primary of a Cluster).
pub(crate) async fn load_library(conn: &mut Conn, library: &Library) -> RedisResult<()> {
    redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(library.code()).query_async::<Value>(conn).await.map(|_| ())
}

/// Calls the function of `library`, loading the library first when Redis
/// does not have it.
pub(crate) async fn fcall(conn: &mut Conn, library: &Library, call: &Call) -> RedisResult<Value> {
    let cmd = call.fcall(library);
    match cmd.query_async::<Value>(conn).await {
        Err(err) if is_missing_function(&err) => {
            tracing::debug!(library = library.name(), "function not found: loading its library and calling again");
            load_library(conn, library).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

pub(crate) async fn eval(conn: &mut Conn, script: &Script, call: &Call) -> RedisResult<Value> {
    let cmd = call.evalsha(script);
    match cmd.query_async::<Value>(conn).await {
        Err(err) if is_noscript(&err) => {
            tracing::debug!(script = script.get_hash(), "NOSCRIPT: loading the script and calling again");
            load(conn, script).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// Runs many calls of `script` in one pipeline. Calls answered `NOSCRIPT`
/// did not run: the script is loaded and only those calls are sent again,
/// so no call applies twice. One result per call, in order.
pub(crate) async fn eval_pipelined(
    conn: &mut Conn,
    script: &Script,
    calls: &[Call],
) -> RedisResult<Vec<RedisResult<Value>>> {
    let run = |conn: &mut Conn, indices: Vec<usize>| {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for &i in &indices {
            pipe.add_command(calls[i].evalsha(script));
        }
        let mut conn = conn.clone();
        async move {
            let values: Vec<Value> = pipe.query_async(&mut conn).await?;
            Ok::<_, RedisError>(indices.into_iter().zip(values).collect::<Vec<_>>())
        }
    };
    let mut results: Vec<Option<Value>> = vec![None; calls.len()];
    let mut todo: Vec<usize> = (0..calls.len()).collect();
    for attempt in 0..3 {
        if todo.is_empty() {
            break;
        }
        let answered = run(conn, std::mem::take(&mut todo)).await?;
        for (i, value) in answered {
            if value_is_noscript(&value) && attempt < 2 {
                todo.push(i);
            } else {
                results[i] = Some(value);
            }
        }
        if !todo.is_empty() {
            tracing::debug!(
                script = script.get_hash(),
                calls = todo.len(),
                "NOSCRIPT in a pipeline: loading the script"
            );
            load(conn, script).await?;
        }
    }
    Ok(results
        .into_iter()
        .map(|v| match v {
            Some(Value::ServerError(e)) => Err(RedisError::from(e)),
            Some(v) => Ok(v),
            None => Err(RedisError::from((ErrorKind::Client, "script call was not answered"))),
        })
        .collect())
}
