//! Reading script replies.

use redis::Value;

/// A reply from Redis did not have the shape the scripts promise (a script
/// of another version, or keys changed by something else).
#[derive(Debug, thiserror::Error)]
#[error("unexpected reply from Redis to {what}: {detail}")]
pub struct ReplyError {
    /// Which call.
    pub what: &'static str,
    /// What was wrong, with the reply.
    pub detail: String,
}

impl ReplyError {
    pub(crate) fn new(what: &'static str, detail: impl Into<String>) -> Self {
        Self { what, detail: detail.into() }
    }

    pub(crate) fn shape(what: &'static str, value: &Value) -> Self {
        Self::new(what, format!("{value:?}"))
    }
}

/// The elements of an array reply (`Nil` is an empty array).
pub(crate) fn array(what: &'static str, value: Value) -> Result<Vec<Value>, ReplyError> {
    match value {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(ReplyError::shape(what, &other)),
    }
}

/// A string element, or `None` for `Nil`.
pub(crate) fn opt_string(what: &'static str, value: &Value) -> Result<Option<String>, ReplyError> {
    match value {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => {
            String::from_utf8(bytes.clone()).map(Some).map_err(|_| ReplyError::new(what, "a string reply is not UTF-8"))
        }
        Value::SimpleString(s) => Ok(Some(s.clone())),
        Value::Okay => Ok(Some("OK".to_owned())),
        Value::Int(i) => Ok(Some(i.to_string())),
        other => Err(ReplyError::shape(what, other)),
    }
}

/// A string element.
pub(crate) fn string(what: &'static str, value: &Value) -> Result<String, ReplyError> {
    opt_string(what, value)?.ok_or_else(|| ReplyError::new(what, "a string is nil"))
}

/// An integer element (integers or numeric strings).
pub(crate) fn int(what: &'static str, value: &Value) -> Result<i64, ReplyError> {
    match value {
        Value::Int(i) => Ok(*i),
        other => {
            let s = string(what, other)?;
            s.parse().map_err(|_| ReplyError::new(what, format!("{s:?} is not an integer")))
        }
    }
}

/// An unsigned integer element that fits `T`.
pub(crate) fn uint<T: TryFrom<i64>>(what: &'static str, value: &Value) -> Result<T, ReplyError> {
    let i = int(what, value)?;
    T::try_from(i).map_err(|_| ReplyError::new(what, format!("{i} is out of range")))
}

/// Element `i` of `items`.
pub(crate) fn at<'a>(what: &'static str, items: &'a [Value], i: usize) -> Result<&'a Value, ReplyError> {
    items
        .get(i)
        .ok_or_else(|| ReplyError::new(what, format!("reply has {} elements, expected more than {i}", items.len())))
}
