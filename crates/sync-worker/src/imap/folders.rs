//! Which folders a poll covers: INBOX, and the special folders found by
//! RFC 6154 SPECIAL-USE attributes, or by their usual names when the server
//! marks none.

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
    /// Its IMAP name.
    pub name: String,
    /// Its role; `None` for INBOX.
    pub role: Option<Role>,
}

/// The special folders among a LIST answer: by attribute first, then (for
/// roles no folder carries) by usual name. Unselectable names are skipped.
pub fn special_folders(names: &[Name]) -> Vec<Folder> {
    let listed: Vec<(&str, &[NameAttribute<'_>])> = names.iter().map(|n| (n.name(), n.attributes())).collect();
    special_folders_of(&listed)
}

/// [`special_folders`] over `(name, attributes)` pairs.
pub fn special_folders_of(names: &[(&str, &[NameAttribute<'_>])]) -> Vec<Folder> {
    let selectable: Vec<&(&str, &[NameAttribute<'_>])> =
        names.iter().filter(|(_, attrs)| !attrs.iter().any(|a| matches!(a, NameAttribute::NoSelect))).collect();
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
            found.push(Folder { name: name.to_string(), role: Some(role) });
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
