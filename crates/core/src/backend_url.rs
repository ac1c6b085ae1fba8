//! Backend URLs: which schemes name a Redis backend, and how to show a URL
//! without its password. Every crate that checks or prints a backend URL
//! uses these, so the accepted schemes and the redaction agree everywhere.

/// The URL schemes of the Redis backend: one server (`redis://`, `rediss://`
/// with TLS) or a Redis Cluster (`redis+cluster://`, `rediss+cluster://`).
pub const REDIS_SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+cluster://", "rediss+cluster://"];

/// The cluster schemes among [`REDIS_SCHEMES`].
pub const REDIS_CLUSTER_SCHEMES: [&str; 2] = ["redis+cluster://", "rediss+cluster://"];

/// What to tell a user who gave another URL.
pub const REDIS_SCHEMES_HELP: &str = "a redis://, rediss://, redis+cluster:// or rediss+cluster:// URL";

/// Whether `url` names the Redis backend.
pub fn is_redis_url(url: &str) -> bool {
    REDIS_SCHEMES.iter().any(|s| url.starts_with(s))
}

/// Whether `url` names a Redis Cluster.
pub fn is_redis_cluster_url(url: &str) -> bool {
    REDIS_CLUSTER_SCHEMES.iter().any(|s| url.starts_with(s))
}

/// `url` without its secret, for messages and logs: in `user:password@` the
/// password becomes `***` (the user name stays, it says which account); a
/// lone `token@` may be a password (`redis://secret@host`), so all of it does.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else { return url.to_owned() };
    // The authority ends at the first '/' after the scheme; '@' is only looked for in it.
    let authority_end = url[scheme_end..].find('/').map_or(url.len(), |i| scheme_end + i);
    let Some(at) = url[scheme_end..authority_end].rfind('@').map(|i| scheme_end + i) else { return url.to_owned() };
    let userinfo = &url[scheme_end..at];
    let shown = match userinfo.split_once(':') {
        Some((user, _)) if !user.is_empty() => format!("{user}:***"),
        _ => "***".to_owned(),
    };
    format!("{}{shown}{}", &url[..scheme_end], &url[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_urls_are_recognised() {
        for url in ["redis://h:1", "rediss://h:1", "redis+cluster://a:1,b:2", "rediss+cluster://a:1"] {
            assert!(is_redis_url(url), "{url}");
        }
        assert!(!is_redis_url("mem://") && !is_redis_url("amqp://x") && !is_redis_url("redis:/h"));
        assert!(is_redis_cluster_url("redis+cluster://a:1") && !is_redis_cluster_url("redis://a:1"));
    }

    #[test]
    fn redaction_hides_the_password_and_keeps_the_user() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://:pw@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis://secret@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis+cluster://u:p@w@a:1,b:2"), "redis+cluster://u:***@a:1,b:2");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("redis://h:1/path@x"), "redis://h:1/path@x");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
