//! The command template every unit (or batch of units) runs.
//!
//! `{unit}` in the program or an argument is replaced by the unit. For a
//! batch, an argument that is exactly `{unit}` becomes one argument per unit,
//! and `{unit}` inside a longer argument becomes the units joined by spaces.
//! A template with no `{unit}` anywhere gets the units appended as arguments.

use leasehold_core::UnitId;

use crate::errors::HopperError;

/// The placeholder replaced by the unit.
pub const PLACEHOLDER: &str = "{unit}";

/// A validated command template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandTemplate {
    parts: Vec<String>,
    has_placeholder: bool,
}

impl CommandTemplate {
    /// Makes a template from the program and its arguments; errors when empty.
    pub fn new(parts: Vec<String>) -> Result<Self, HopperError> {
        if parts.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(HopperError::MissingCommand);
        }
        let has_placeholder = parts.iter().any(|p| p.contains(PLACEHOLDER));
        Ok(Self { parts, has_placeholder })
    }

    /// The template as given.
    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The template with `from` replaced by `to` in every part (a path
    /// known only once the run starts).
    pub fn replacing(self, from: &str, to: &str) -> Self {
        let parts = self.parts.into_iter().map(|p| p.replace(from, to)).collect();
        Self { parts, has_placeholder: self.has_placeholder }
    }

    /// The program and arguments for one batch of units (a batch of one is a
    /// single unit).
    pub fn render(&self, units: &[UnitId]) -> Vec<String> {
        let mut out = Vec::with_capacity(self.parts.len() + units.len());
        let joined = || units.iter().map(UnitId::as_str).collect::<Vec<_>>().join(" ");
        for part in &self.parts {
            if part == PLACEHOLDER {
                out.extend(units.iter().map(|u| u.as_str().to_owned()));
            } else if part.contains(PLACEHOLDER) {
                out.push(part.replace(PLACEHOLDER, &joined()));
            } else {
                out.push(part.clone());
            }
        }
        if !self.has_placeholder {
            out.extend(units.iter().map(|u| u.as_str().to_owned()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(parts: &[&str]) -> CommandTemplate {
        CommandTemplate::new(parts.iter().map(|s| s.to_string()).collect()).unwrap()
    }

    fn u(names: &[&str]) -> Vec<UnitId> {
        names.iter().map(|n| UnitId::new(*n).unwrap()).collect()
    }

    #[test]
    fn substitutes_or_appends() {
        assert_eq!(t(&["sh", "{unit}"]).render(&u(&["a b.sh"])), vec!["sh", "a b.sh"]);
        assert_eq!(t(&["run", "--file={unit}", "-v"]).render(&u(&["x"])), vec!["run", "--file=x", "-v"]);
        assert_eq!(t(&["rspec"]).render(&u(&["a", "b"])), vec!["rspec", "a", "b"]);
        assert_eq!(t(&["t", "{unit}", "--"]).render(&u(&["a", "b"])), vec!["t", "a", "b", "--"]);
        assert_eq!(t(&["sh", "-c", "echo {unit}"]).render(&u(&["a", "b"])), vec!["sh", "-c", "echo a b"]);
    }

    #[test]
    fn empty_command_is_rejected() {
        assert!(matches!(CommandTemplate::new(vec![]), Err(HopperError::MissingCommand)));
        assert!(matches!(CommandTemplate::new(vec![" ".into()]), Err(HopperError::MissingCommand)));
    }
}
