//! The `sync-worker` command line: parses it and runs the command. The
//! processes (`worker`, `serve`, `api`) are [`crate::app`]'s, started here
//! and stopped on SIGTERM or Ctrl-C; the operator commands (`user add`,
//! `account add | update | list | status | remove`) run here. The binary is a few
//! lines over [`run`].
//!
//! Storage comes from `DATABASE_URL` (absent: `sqlite://sync-worker.db`),
//! the password key from `SECRET_KEY` or `SECRET_KEY_FILE` (absent: the file
//! `sync-worker.key`, generated with mode 0600). An IMAP password is read
//! from `IMAP_PASSWORD` or, when that is unset, from the first line of
//! stdin: never from an argument, where `ps` would show it. So is an
//! OAuth2 refresh token (`OAUTH2_REFRESH_TOKEN`), with the client secret
//! in `OAUTH2_CLIENT_SECRET`.

use std::future::Future;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use leasehold_core::{LeaseKey, WorkerId};

use crate::api::{ApiSettings, ApiState};
use crate::app::serve::{self, Parts};
use crate::app::{open_storage, open_worker_storage, start_worker, wiring};
use crate::config::Config;
use crate::imap::{ImapSettings, ImapSource, LoginError};
use crate::oauth2::{grant_from, OAuth2Provider};
use crate::storage::{AccountAuth, Credentials, Email, LoginChange, NewAccount, Security, SyncState};

/// `sync-worker`: owns a fair share of the live IMAP accounts and keeps them synced.
#[derive(Parser, Debug)]
#[command(name = "sync-worker", version, about = "Owns a fair share of the live IMAP accounts and keeps them synced")]
pub struct Cli {
    /// This worker's id (default: `<hostname>-<pid>-<random>`).
    #[arg(long, env = "WORKER_ID", global = true)]
    worker_id: Option<String>,
    /// Log filter (tracing-subscriber syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info", global = true)]
    log: String,
    /// What to do (default: `worker`).
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the sync engine: own a fair share of the accounts and sync them.
    Worker,
    /// Run the API, the console and a worker in one process (LISTEN, default 127.0.0.1:8080).
    Serve,
    /// Run the API and the console alone (scale-out: next to `worker`s, on Redis and Postgres).
    Api,
    /// Manage users.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage IMAP accounts.
    #[command(subcommand)]
    Account(AccountCommand),
}

#[derive(Subcommand, Debug)]
enum UserCommand {
    /// Add a user.
    Add {
        /// The user's e-mail address.
        #[arg(long)]
        email: Email,
    },
}

/// How an account logs in.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum AuthKind {
    /// An IMAP password (IMAP_PASSWORD or stdin).
    Password,
    /// OAuth2: a refresh token (OAUTH2_REFRESH_TOKEN or stdin) for a client
    /// (--oauth2-client-id, OAUTH2_CLIENT_SECRET) at a token endpoint
    /// (--oauth2-provider or --oauth2-token-url).
    Oauth2,
}

/// The OAuth2 client of an `--auth oauth2` account.
#[derive(clap::Args, Debug, Clone)]
struct OAuth2Args {
    /// `google` or `microsoft`: their token endpoint and scope.
    #[arg(long, value_enum)]
    oauth2_provider: Option<OAuth2Provider>,
    /// The token endpoint, for another provider (or to override the preset's).
    #[arg(long)]
    oauth2_token_url: Option<String>,
    /// The OAuth2 client id (the secret, if any, comes from OAUTH2_CLIENT_SECRET).
    #[arg(long)]
    oauth2_client_id: Option<String>,
    /// The scope to ask for on refresh, overriding the preset's.
    #[arg(long)]
    oauth2_scope: Option<String>,
}

#[derive(Subcommand, Debug)]
enum AccountCommand {
    /// Add an IMAP account (after checking that its login works). The
    /// password comes from IMAP_PASSWORD or the first line of stdin; with
    /// `--auth oauth2`, the refresh token comes from OAUTH2_REFRESH_TOKEN or
    /// the first line of stdin.
    Add {
        /// The owning user's e-mail address.
        #[arg(long)]
        user: Email,
        /// The IMAP server's host name.
        #[arg(long)]
        host: String,
        /// Its port (993 for tls, 143 for starttls).
        #[arg(long)]
        port: u16,
        /// How to reach it; `plain` sends the password unencrypted (loopback and tests only).
        #[arg(long, value_enum)]
        security: Security,
        /// The IMAP login.
        #[arg(long)]
        username: String,
        /// How it logs in.
        #[arg(long, value_enum, default_value = "password")]
        auth: AuthKind,
        #[command(flatten)]
        oauth2: OAuth2Args,
    },
    /// Change an account's server, security or password, after checking
    /// that the login works with them; its synced mail stays, and a login
    /// the server had refused is tried again at once. The new password
    /// comes from IMAP_PASSWORD or the first line of stdin.
    Update {
        /// The account id.
        id: String,
        /// Another IMAP server host name.
        #[arg(long)]
        host: Option<String>,
        /// Another port.
        #[arg(long)]
        port: Option<u16>,
        /// Another way to reach it.
        #[arg(long, value_enum)]
        security: Option<Security>,
        /// Keep the stored password or OAuth2 grant (check the login with
        /// it again, e.g. after the provider unlocked the account).
        #[arg(long)]
        keep_password: bool,
        /// How it logs in from now on (its new secret as for `account add`).
        #[arg(long, value_enum, default_value = "password")]
        auth: AuthKind,
        #[command(flatten)]
        oauth2: OAuth2Args,
    },
    /// List the accounts.
    List {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show an account's tier, owner, last sync, last error and message counts.
    Status {
        /// The account id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an account and all its mail.
    Remove {
        /// The account id.
        id: String,
    },
}

/// Parses the command line and runs it.
pub async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(crate::logging::filter(&cli.log).context("invalid --log / RUST_LOG filter")?)
        .with_writer(std::io::stderr);
    // LOG_FORMAT=json: one JSON object a line, for a log collector.
    match std::env::var("LOG_FORMAT").unwrap_or_default().trim() {
        "" | "text" => logs.init(),
        "json" => logs.json().init(),
        other => anyhow::bail!("LOG_FORMAT={other:?} is invalid: expected `text` (the default) or `json`"),
    }
    let config = Config::from_env().context("invalid configuration")?;
    match cli.command.unwrap_or(Command::Worker) {
        Command::Worker => worker(worker_id(cli.worker_id.as_deref(), &config)?, config).await,
        Command::Serve => api(Some(worker_id(cli.worker_id.as_deref(), &config)?), config).await,
        Command::Api => api(None, config).await,
        Command::User(UserCommand::Add { email }) => {
            let storage = open_storage().await?;
            let user = storage.add_user(&email).await?;
            println!("{}", user.id);
            Ok(())
        }
        Command::Account(cmd) => account(cmd, config).await,
    }
}

/// The worker's id: `--worker-id`, else `WORKER_ID`, else one made for this process.
fn worker_id(flag: Option<&str>, config: &Config) -> anyhow::Result<WorkerId> {
    match flag.or(config.worker_id.as_ref().map(WorkerId::as_str)) {
        Some(id) => WorkerId::new(id).context("invalid --worker-id / WORKER_ID"),
        None => Ok(WorkerId::for_this_process()),
    }
}

/// `worker`: the sync engine alone.
async fn worker(worker: WorkerId, config: Config) -> anyhow::Result<()> {
    let storage = open_worker_storage(&worker, &config).await?;
    let backend = wiring::connect(&config).await.context("could not connect the backend")?;
    let mut running = start_worker(worker, &storage, &backend, &config).await.context("could not start the worker")?;
    if let Some(addr) = metrics_listen()? {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("could not listen on METRICS_LISTEN={addr}"))?;
        let state =
            ApiState::new(storage.clone(), backend.store().clone(), backend.bus().clone(), ApiSettings::new(&config))
                .with_worker(running.coordinator().observer());
        tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
        tokio::spawn(async move {
            if let Err(e) = crate::api::serve_ops(listener, state, std::future::pending()).await {
                tracing::error!(error = %e, "the metrics listener failed");
            }
        });
    }
    if let Some(ended) = until_signal(running.finished()).await? {
        return ended.context("the coordinator ended unexpectedly");
    }
    tracing::info!("shutdown signal: releasing leases");
    running.shutdown().await.context("shutdown failed")?;
    storage.close().await;
    Ok(())
}

/// `METRICS_LISTEN`: where `worker` serves `/metrics`, `/healthz` and
/// `/readyz` (absent: nowhere).
fn metrics_listen() -> anyhow::Result<Option<std::net::SocketAddr>> {
    match std::env::var("METRICS_LISTEN").ok().filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| {
            anyhow::anyhow!("METRICS_LISTEN={v:?} is invalid: expected an address and port such as 0.0.0.0:9090")
        }),
    }
}

/// `serve` (with a worker) and `api` (without).
async fn api(worker: Option<WorkerId>, config: Config) -> anyhow::Result<()> {
    let settings = ApiSettings::from_env(&config).context("invalid configuration")?;
    let storage = match &worker {
        Some(worker) => open_worker_storage(worker, &config).await?,
        None => open_storage().await?,
    };
    let backend = wiring::connect(&config).await.context("could not connect the backend")?;
    tracing::info!(backend = %backend.name(), database = ?storage.kind(), "starting the API");
    let parts = Parts { storage: storage.clone(), backend, config, settings };
    let mut running = serve::start(parts, worker).await?;
    println!("sync-worker API on http://{}/", running.addr());
    if let Some(ended) = until_signal(running.finished()).await? {
        return ended;
    }
    tracing::info!("shutdown signal: stopping the API and releasing leases");
    running.shutdown().await?;
    storage.close().await;
    Ok(())
}

/// Waits for SIGTERM or Ctrl-C (`None`) or for `finished` to end first (`Some`, its result).
async fn until_signal<T>(finished: impl Future<Output = T>) -> anyhow::Result<Option<T>> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("could not install the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => Ok(None),
        r = tokio::signal::ctrl_c() => r.context("could not listen for Ctrl-C").map(|()| None),
        r = finished => Ok(Some(r)),
    }
}

/// A secret from `env`, or else the first line of stdin (never an argument).
fn read_secret(env: &str, what: &str) -> anyhow::Result<String> {
    if let Ok(p) = std::env::var(env) {
        if !p.is_empty() {
            return Ok(p);
        }
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("{what}: ");
        std::io::stderr().flush().ok();
    }
    let mut line = String::new();
    stdin.lock().read_line(&mut line).with_context(|| format!("could not read the {what} from stdin"))?;
    let secret = line.trim_end_matches(['\r', '\n']).to_string();
    if secret.is_empty() {
        bail!("no {what}: set {env} or pass it on stdin (never as an argument)");
    }
    Ok(secret)
}

/// The login `auth` asks for, its secret read as [`read_secret`] does.
fn read_auth(auth: AuthKind, oauth2: OAuth2Args) -> anyhow::Result<AccountAuth> {
    match auth {
        AuthKind::Password => Ok(AccountAuth::Password(read_secret("IMAP_PASSWORD", "IMAP password")?)),
        AuthKind::Oauth2 => {
            let Some(client_id) = oauth2.oauth2_client_id else {
                bail!("--auth oauth2 needs --oauth2-client-id (and OAUTH2_CLIENT_SECRET unless the client is public)");
            };
            let refresh_token = read_secret("OAUTH2_REFRESH_TOKEN", "OAuth2 refresh token")?;
            let secret = std::env::var("OAUTH2_CLIENT_SECRET").ok();
            let grant = grant_from(
                oauth2.oauth2_provider,
                oauth2.oauth2_token_url,
                client_id,
                secret,
                refresh_token,
                oauth2.oauth2_scope,
            )
            .context("invalid OAuth2 settings (see --oauth2-provider, --oauth2-token-url)")?;
            Ok(AccountAuth::OAuth2(grant))
        }
    }
}

/// A stored time (ms since the epoch) as people read it: UTC, RFC 3339.
fn shown_time(ms: Option<i64>) -> String {
    match ms.and_then(|ms| u64::try_from(ms).ok()) {
        Some(ms) => {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            humantime::format_rfc3339_seconds(at).to_string()
        }
        None => "never".to_owned(),
    }
}

/// Logs in with `login` and out again, before anything is written, and
/// answers the server's address; the error says so with `outcome`
/// ("nothing saved").
async fn check_login(login: &Credentials, config: &Config, outcome: &str) -> anyhow::Result<std::net::IpAddr> {
    match ImapSource::verify_login(login, &ImapSettings::from(config)).await {
        Ok(ip) => Ok(ip),
        Err(e @ LoginError::Refused { .. }) => bail!("{e}: {outcome}"),
        Err(e) => Err(anyhow::Error::new(e).context(format!("the login check failed: {outcome}"))),
    }
}

/// The lease store the workers share, when there is one (see [`wiring::shared_store`]).
async fn shared_store(config: &Config) -> anyhow::Result<Option<Arc<dyn crate::leases::Leases>>> {
    wiring::shared_store(config).await.context("could not connect the lease store")
}

async fn account(cmd: AccountCommand, config: Config) -> anyhow::Result<()> {
    let storage = open_storage().await?;
    match cmd {
        AccountCommand::Add { user, host, port, security, username, auth, oauth2 } => {
            let Some(user) = storage.user_by_email(&user).await? else {
                bail!("no user {user}: add it first with `sync-worker user add --email {user}`");
            };
            // The operator may learn it before the login; the API's users only after it.
            if let Some(other) = storage.same_mailbox(&user.id, &host, port, &username, None, None).await? {
                bail!("account {username}@{host}:{port} already exists for {} ({other}): nothing changed", user.email);
            }
            let login = read_auth(auth, oauth2)?;
            let creds = Credentials { host: host.clone(), port, security, username: username.clone(), auth: login };
            let server_ip = check_login(&creds, &config, "nothing saved").await?;
            if let Some(other) = storage.same_mailbox(&user.id, &host, port, &username, Some(server_ip), None).await? {
                bail!(
                    "this mailbox already exists for {}, as account {other} (the same server at {server_ip}): nothing saved",
                    user.email
                );
            }
            let id = storage
                .add_account(&NewAccount { user: user.id, host, port, security, username, auth: creds.auth })
                .await?;
            storage.record_server_ip(id.as_str(), server_ip).await?;
            if let Some(store) = shared_store(&config).await? {
                crate::leases::account_added(store.as_ref(), &id, storage.bucket_of(id.as_str()))
                    .await
                    .context("saved, but could not mark it live (workers will at their next reconcile)")?;
            }
            println!("{id}");
            Ok(())
        }
        AccountCommand::Update { id, host, port, security, keep_password, auth, oauth2 } => {
            let key =
                LeaseKey::new(&id).with_context(|| format!("no account {id} (see `sync-worker account list`)"))?;
            if storage.account(&id).await?.is_none() {
                bail!("no account {id} (see `sync-worker account list`)");
            }
            let login = if keep_password { None } else { Some(read_auth(auth, oauth2)?) };
            let change = LoginChange { host, port, security, auth: login };
            let login = change.apply(storage.credentials(&key).await?);
            let server_ip = check_login(&login, &config, "nothing changed").await?;
            let user = storage.account_user(&id).await?;
            if let Some(user) = user {
                let same =
                    storage.same_mailbox(&user, &login.host, login.port, &login.username, Some(server_ip), Some(&id));
                if let Some(other) = same.await? {
                    bail!("the change makes it the same mailbox as account {other}: nothing changed");
                }
            }
            storage.update_login(&key, &login, Some(server_ip)).await?;
            println!("updated {id}");
            Ok(())
        }
        AccountCommand::List { json } => {
            let accounts = storage.list_accounts().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&accounts)?);
            } else {
                for a in accounts {
                    println!(
                        "{}  {}  {}@{}:{} ({})  last sync: {}  last error: {}",
                        a.id,
                        a.user,
                        a.username,
                        a.host,
                        a.port,
                        a.security,
                        shown_time(a.last_sync_at),
                        a.last_error.as_deref().unwrap_or("none")
                    );
                }
            }
            Ok(())
        }
        AccountCommand::Status { id, json } => {
            let Some(a) = storage.account(&id).await? else {
                bail!("no account {id} (see `sync-worker account list`)")
            };
            let folders = storage.folder_counts(&id).await?;
            let (mut tier, mut owner, mut holder) = (None, a.owner.clone(), None);
            let key = LeaseKey::new(&id)?;
            if let Some(store) = shared_store(&config).await? {
                tier = store.tier(&key).await?.map(|t| t.to_string());
                holder = crate::leases::account_holder(store.as_ref(), &key, storage.bucket_of(&id)).await?;
                owner = holder.as_ref().map(|l| l.owner.to_string());
            }
            let stored = storage.fence_token(&key).await?.unwrap_or(leasehold_core::FencingToken(0));
            let state = SyncState::of(holder.as_ref(), stored, a.last_sync_at, a.last_error.as_deref()).to_string();
            if json {
                let v = serde_json::json!({
                    "id": a.id,
                    "tier": tier,
                    "owner": owner,
                    "last_sync_at": a.last_sync_at,
                    "last_error": a.last_error,
                    "state": state,
                    "folders": folders,
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("account {}: {}@{}:{} of {}", a.id, a.username, a.host, a.port, a.user);
                println!("tier: {}", tier.as_deref().unwrap_or("unknown (no shared lease store)"));
                println!("owner: {}", owner.as_deref().unwrap_or("none"));
                println!("state: {state}");
                println!("last sync: {}", shown_time(a.last_sync_at));
                println!("last error: {}", a.last_error.as_deref().unwrap_or("none"));
                for f in folders {
                    let noun = if f.messages == 1 { "message" } else { "messages" };
                    println!("  {}: {} {noun}", f.name, f.messages);
                }
            }
            Ok(())
        }
        AccountCommand::Remove { id } => {
            if !storage.remove_account(&id).await? {
                bail!("no account {id}: nothing removed");
            }
            if let Some(store) = shared_store(&config).await? {
                crate::leases::account_removed(store.as_ref(), &LeaseKey::new(&id)?, storage.bucket_of(&id)).await?;
            }
            println!("removed {id}");
            Ok(())
        }
    }
}
