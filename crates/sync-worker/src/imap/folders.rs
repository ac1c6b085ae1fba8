//! Which folders a poll covers: every selectable folder of the LIST answer
//! (`\Noselect` and `\NonExistent` skipped), their names decoded from
//! modified UTF-7 (RFC 3501 §5.1.3), and among them the special folders
//! found by RFC 6154 SPECIAL-USE attributes, or by their usual names when
//! the server marks none.

use std::borrow::Cow;

use async_imap::types::{Name, NameAttribute};

/// The role of a special folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// `\Sent`.
    Sent,
    /// `\Drafts`.
    Drafts,
    /// `\Archive`.
    Archive,
    /// `\Junk`.
    Junk,
    /// `\Trash`.
    Trash,
    /// `\All`.
    All,
}

impl Role {
    /// Every role, in poll order.
    pub const ALL: [Role; 6] = [Role::Sent, Role::Drafts, Role::Archive, Role::Junk, Role::Trash, Role::All];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Sent => "sent",
            Role::Drafts => "drafts",
            Role::Archive => "archive",
            Role::Junk => "junk",
            Role::Trash => "trash",
            Role::All => "all",
        }
    }

    fn of_attribute(a: &NameAttribute<'_>) -> Option<Role> {
        Some(match a {
            NameAttribute::Sent => Role::Sent,
            NameAttribute::Drafts => Role::Drafts,
            NameAttribute::Archive => Role::Archive,
            NameAttribute::Junk => Role::Junk,
            NameAttribute::Trash => Role::Trash,
            NameAttribute::All => Role::All,
            _ => return None,
        })
    }

    /// The names clients commonly give it (compared without case, with or
    /// without an `INBOX.` / `INBOX/` prefix). `\All` has no usual name.
    fn usual_names(self) -> &'static [&'static str] {
        match self {
            Role::Sent => &["sent", "sent items", "sent messages", "sent mail"],
            Role::Drafts => &["drafts", "draft"],
            Role::Archive => &["archive", "archives"],
            Role::Junk => &["junk", "spam", "junk e-mail", "junk email"],
            Role::Trash => &["trash", "deleted items", "deleted messages", "bin"],
            Role::All => &[],
        }
    }
}

/// A folder a poll syncs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folder {
    /// Its IMAP name, as the server spells it on the wire (modified UTF-7).
    pub name: String,
    /// Its decoded name (`Projekte/Ärger`, levels joined by the server's
    /// hierarchy delimiter): the name storage and the API use.
    pub path: String,
    /// Its role; `None` for INBOX and user folders.
    pub role: Option<Role>,
}

impl Folder {
    /// A folder of the wire name `name`, its path decoded.
    pub fn new(name: &str, role: Option<Role>) -> Self {
        Self { name: name.to_string(), path: decode_modified_utf7(name), role }
    }
}

/// Whether a LIST entry can be selected: `\Noselect` (a level of the
/// hierarchy only) and `\NonExistent` (RFC 5258) cannot.
fn selectable(attrs: &[NameAttribute<'_>]) -> bool {
    !attrs.iter().any(|a| match a {
        NameAttribute::NoSelect => true,
        NameAttribute::Extension(x) => x.trim_start_matches('\\').eq_ignore_ascii_case("NonExistent"),
        _ => false,
    })
}

/// Every folder a poll covers, from a LIST answer: INBOX first, then the
/// special folders (in [`Role::ALL`] order), then the rest by name. At most
/// `limit` are returned; the second value is how many selectable folders
/// were listed in all.
pub fn all_folders(names: &[Name], limit: usize) -> (Vec<Folder>, usize) {
    let unescaped: Vec<_> = names.iter().map(|n| (unescape_quoted(n.name()), n.attributes())).collect();
    let listed: Vec<(&str, &[NameAttribute<'_>])> = unescaped.iter().map(|(n, a)| (n.as_ref(), *a)).collect();
    all_folders_of(&listed, limit)
}

/// A mailbox name as the server means it. async-imap hands a quoted name
/// over with its escapes (`"Zitat \"x\""` as `Zitat \"x\"`), and the name
/// is quoted again when it is sent: without this, a name with `"` or `\`
/// would be escaped twice and never found.
pub fn unescape_quoted(name: &str) -> Cow<'_, str> {
    if !name.contains('\\') {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len());
    let mut chars = name.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`all_folders`] over `(name, attributes)` pairs.
pub fn all_folders_of(names: &[(&str, &[NameAttribute<'_>])], limit: usize) -> (Vec<Folder>, usize) {
    let mut found = vec![Folder::new("INBOX", None)];
    found.extend(special_folders_of(names));
    let mut rest: Vec<Folder> = names
        .iter()
        .filter(|(name, attrs)| {
            selectable(attrs) && !name.eq_ignore_ascii_case("INBOX") && !found.iter().any(|f| f.name == *name)
        })
        .map(|(name, _)| Folder::new(name, None))
        .collect();
    rest.sort_by(|a, b| a.path.cmp(&b.path));
    rest.dedup_by(|a, b| a.name == b.name);
    found.extend(rest);
    let total = found.len();
    found.truncate(limit.max(1));
    (found, total)
}

/// Decodes a modified UTF-7 mailbox name (RFC 3501 §5.1.3): `&` starts a
/// run of modified base64 (`,` for `/`, no padding) of UTF-16BE, ended by
/// `-`; `&-` is a literal `&`. No crate on crates.io does just this and is
/// kept up to date, hence these few lines. A name that is not valid
/// modified UTF-7 (a server that sends raw UTF-8, as some do) is returned
/// as it is, so it can still be synced and shown.
pub fn decode_modified_utf7(name: &str) -> String {
    use base64::Engine as _;
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::IMAP_MUTF7,
        base64::engine::GeneralPurposeConfig::new()
            .with_encode_padding(false)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone),
    );
    let decoded = (|| {
        let mut out = String::with_capacity(name.len());
        let mut rest = name;
        while let Some(start) = rest.find('&') {
            out.push_str(&rest[..start]);
            let after = &rest[start + 1..];
            let end = after.find('-')?;
            let run = &after[..end];
            if run.is_empty() {
                out.push('&');
            } else {
                let bytes = engine.decode(run).ok()?;
                if bytes.len() % 2 != 0 {
                    return None;
                }
                let units: Vec<u16> = bytes.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
                out.push_str(&String::from_utf16(&units).ok()?);
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Some(out)
    })();
    decoded.unwrap_or_else(|| name.to_string())
}

/// Encodes a mailbox name in modified UTF-7 (RFC 3501 §5.1.3), the
/// inverse of [`decode_modified_utf7`]: printable ASCII stays, `&` becomes
/// `&-`, and every other run of characters becomes `&` + modified base64
/// of its UTF-16BE + `-`.
pub fn encode_modified_utf7(name: &str) -> String {
    use base64::Engine as _;
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::IMAP_MUTF7,
        base64::engine::GeneralPurposeConfig::new().with_encode_padding(false),
    );
    let direct = |c: char| (' '..='~').contains(&c);
    let mut out = String::with_capacity(name.len());
    let mut run: Vec<u16> = Vec::new();
    let flush = |run: &mut Vec<u16>, out: &mut String| {
        if !run.is_empty() {
            let bytes: Vec<u8> = run.iter().flat_map(|u| u.to_be_bytes()).collect();
            out.push('&');
            out.push_str(&engine.encode(bytes));
            out.push('-');
            run.clear();
        }
    };
    for c in name.chars() {
        if direct(c) {
            flush(&mut run, &mut out);
            if c == '&' {
                out.push_str("&-");
            } else {
                out.push(c);
            }
        } else {
            run.extend(c.encode_utf16(&mut [0; 2]).iter());
        }
    }
    flush(&mut run, &mut out);
    out
}

/// The special folders among a LIST answer: by attribute first, then (for
/// roles no folder carries) by usual name. Unselectable names are skipped.
pub fn special_folders(names: &[Name]) -> Vec<Folder> {
    let unescaped: Vec<_> = names.iter().map(|n| (unescape_quoted(n.name()), n.attributes())).collect();
    let listed: Vec<(&str, &[NameAttribute<'_>])> = unescaped.iter().map(|(n, a)| (n.as_ref(), *a)).collect();
    special_folders_of(&listed)
}

/// [`special_folders`] over `(name, attributes)` pairs.
pub fn special_folders_of(names: &[(&str, &[NameAttribute<'_>])]) -> Vec<Folder> {
    let selectable: Vec<&(&str, &[NameAttribute<'_>])> = names.iter().filter(|(_, attrs)| selectable(attrs)).collect();
    let mut found: Vec<Folder> = Vec::new();
    for role in Role::ALL {
        let by_attr = selectable.iter().find(|(_, attrs)| attrs.iter().any(|a| Role::of_attribute(a) == Some(role)));
        let by_name = || {
            selectable.iter().find(|(name, _)| {
                let lower = name.to_lowercase();
                let bare = lower.strip_prefix("inbox.").or_else(|| lower.strip_prefix("inbox/")).unwrap_or(&lower);
                role.usual_names().contains(&bare)
            })
        };
        if let Some((name, _)) = by_attr.or_else(by_name) {
            if name.eq_ignore_ascii_case("INBOX") || found.iter().any(|f| f.name == *name) {
                continue;
            }
            found.push(Folder::new(name, Some(role)));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(found: &[Folder]) -> Vec<(&str, Role)> {
        found.iter().map(|f| (f.name.as_str(), f.role.expect("a role"))).collect()
    }

    #[test]
    fn quoted_names_lose_their_escapes_once() {
        assert_eq!(unescape_quoted(r#"Zitat \"x\""#), r#"Zitat "x""#);
        assert_eq!(unescape_quoted(r"Back\\slash"), r"Back\slash");
        assert_eq!(unescape_quoted("Projekte/&AMQ-rger"), "Projekte/&AMQ-rger");
        assert!(matches!(unescape_quoted("INBOX"), Cow::Borrowed("INBOX")));
    }

    #[test]
    fn modified_utf7_names_are_decoded() {
        assert_eq!(decode_modified_utf7("Projekte/&AMQ-rger"), "Projekte/Ärger");
        assert_eq!(decode_modified_utf7("&ZeVnLIqe-"), "日本語");
        assert_eq!(decode_modified_utf7("Tom &- Jerry"), "Tom & Jerry");
        assert_eq!(decode_modified_utf7("INBOX"), "INBOX");
        // Not modified UTF-7 (an unterminated run, raw UTF-8): kept as sent.
        assert_eq!(decode_modified_utf7("a&AMQ"), "a&AMQ");
        assert_eq!(decode_modified_utf7("Ärger"), "Ärger");
    }

    #[test]
    fn names_are_encoded_as_servers_spell_them() {
        assert_eq!(encode_modified_utf7("Projekte/Ärger"), "Projekte/&AMQ-rger");
        assert_eq!(encode_modified_utf7("日本語"), "&ZeVnLIqe-");
        assert_eq!(encode_modified_utf7("Tom & Jerry"), "Tom &- Jerry");
        assert_eq!(encode_modified_utf7("INBOX"), "INBOX");
        assert_eq!(encode_modified_utf7("😀 smile"), "&2D3eAA- smile");
    }

    proptest::proptest! {
        #[test]
        fn encoding_then_decoding_gives_the_name_back(name in "\\PC{0,16}") {
            proptest::prop_assert_eq!(decode_modified_utf7(&encode_modified_utf7(&name)), name);
        }
    }

    #[test]
    fn every_selectable_folder_is_listed_inbox_and_specials_first() {
        let none: [NameAttribute<'_>; 0] = [];
        let noselect = [NameAttribute::NoSelect];
        let gone = [NameAttribute::Extension("\\NonExistent".into())];
        let sent = [NameAttribute::Sent];
        let listed = [
            ("Projekte", &noselect[..]),
            ("Projekte/&AMQ-rger", &none[..]),
            ("INBOX", &none[..]),
            ("Zeug", &none[..]),
            ("Alt", &gone[..]),
            ("Gesendet", &sent[..]),
            ("Archiv", &none[..]),
        ];
        let (found, total) = all_folders_of(&listed, 100);
        let paths: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, vec!["INBOX", "Gesendet", "Archiv", "Projekte/Ärger", "Zeug"]);
        assert_eq!(found[3].name, "Projekte/&AMQ-rger");
        assert_eq!(total, 5);
        let (found, total) = all_folders_of(&listed, 3);
        assert_eq!(found.len(), 3);
        assert_eq!(total, 5);
    }

    #[test]
    fn attributes_win_over_names() {
        let sent = [NameAttribute::Sent];
        let none: [NameAttribute<'_>; 0] = [];
        let found = special_folders_of(&[("INBOX", &none), ("Sent", &none), ("Gesendet", &sent), ("Trash", &none)]);
        assert_eq!(roles(&found), vec![("Gesendet", Role::Sent), ("Trash", Role::Trash)]);
    }

    #[test]
    fn usual_names_are_the_fallback_with_or_without_an_inbox_prefix() {
        let none: [NameAttribute<'_>; 0] = [];
        let noselect = [NameAttribute::NoSelect];
        let found = special_folders_of(&[
            ("INBOX", &none),
            ("INBOX.Sent Items", &none),
            ("Drafts", &noselect),
            ("INBOX/Spam", &none),
            ("Deleted Messages", &none),
            ("Archive", &none),
            ("Projects", &none),
        ]);
        assert_eq!(
            roles(&found),
            vec![
                ("INBOX.Sent Items", Role::Sent),
                ("Archive", Role::Archive),
                ("INBOX/Spam", Role::Junk),
                ("Deleted Messages", Role::Trash)
            ]
        );
    }
}
