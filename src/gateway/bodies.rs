//! Every gateway answer's body is read with a size limit. A gateway, or a proxy in
//! front of it, that answers a charge with megabytes (or an endless stream) must
//! not be able to make the worker hold them all: past the limit the answer is not
//! read further, and what that means is the caller's to say (a 2xx to a POST whose
//! body is too large is an unknown outcome, looked up like any unreadable one).

/// An answer about one object: a charge, a refund, a look-up, a Stripe page of at
/// most 100 objects. Real ones are a few hundred bytes to a few hundred kilobytes.
pub(super) const ONE_ANSWER: usize = 4 << 20;

/// The `charges` gateway's whole ledger in one answer (`audit`, never a payment).
pub(super) const LISTING: usize = 512 << 20;

/// An error answer: only its reason is kept, shortened, so its start is enough.
const ERROR_PREFIX: usize = 64 << 10;

/// Why a body was not read whole.
#[derive(Debug)]
pub(super) enum BodyError {
    /// The connection broke (or timed out) before the body's end.
    Transport(reqwest::Error),
    /// The body is longer than the limit: not read past it.
    TooLarge { limit: usize },
}

impl BodyError {
    /// What an operator is told about it.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Transport(error) => {
                format!("the body broke off: {}", super::transport::describe(error))
            }
            Self::TooLarge { limit } => format!("the body is larger than {} KiB", limit >> 10),
        }
    }
}

/// The whole body, when it is at most `limit` bytes.
pub(super) async fn read_body(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    // A declared length over the limit is refused before anything is read; a
    // declared length is still not trusted for the reads below.
    let declared = response.content_length().unwrap_or(0);
    if declared > limit as u64 {
        return Err(BodyError::TooLarge { limit });
    }
    // Nor is it allocated ahead beyond a small start: a server can declare anything.
    let mut body = Vec::with_capacity((declared as usize).min(64 << 10));
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The start of an error answer's body as text (at most [`ERROR_PREFIX`] bytes, a
/// character cut at the end replaced): a body that breaks off or is too large
/// still gives what was read.
pub(super) async fn error_text(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = ERROR_PREFIX - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() == ERROR_PREFIX {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}
