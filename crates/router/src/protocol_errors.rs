//! JSON bodies for the error responses hyper writes on its own (issue 12 item 7).
//!
//! When a request head does not parse — a malformed request line, header bytes that are not a
//! token, a `Content-Length` that is not a number or two that disagree (400), too many or too
//! large headers (431), a request target longer than hyper takes (414) — hyper answers before
//! any service runs, with a bare head (`content-length: 0` and `date`), and closes the
//! connection. hyper 1.x offers no hook for that answer, so [`JsonProtocolErrors`] sits between
//! hyper and the socket and replaces exactly that shape with the same status, `connection:
//! close` and an error body in the OpenAI shape (the request was never parsed, so its dialect
//! is unknown; OpenAI's is the default of every endpoint but `/v1/messages`).
//!
//! Only a write that is a whole response head, status 400, 414 or 431, with no headers other
//! than `content-length: 0`, `date` and `connection` is replaced: every response the router's
//! own handlers give carries a `content-type`, so none of them matches.
//!
//! Not covered: a connection that ends before its head is complete, or the header-read
//! timeout, get no response from hyper at all (there is nothing to replace; the client is gone
//! or silent).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::wire::{Dialect, error_body};

/// A socket whose hyper-generated protocol error responses get JSON bodies (module docs).
#[derive(Debug)]
pub struct JsonProtocolErrors<S> {
    inner: S,
    /// A replacement response still to be written, and how much of it is written.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonProtocolErrors<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        JsonProtocolErrors {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

impl<S: AsyncWrite + Unpin> JsonProtocolErrors<S> {
    /// Writes what is left of a replacement response.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> JsonProtocolErrors<S> {
    /// Takes a write of `taken` bytes whole, answering with `replacement` instead; what the
    /// socket does not take now is written on the next poll.
    fn start_replacement(
        &mut self,
        cx: &mut Context<'_>,
        replacement: Vec<u8>,
        taken: usize,
    ) -> Poll<io::Result<usize>> {
        self.pending = replacement;
        self.written = 0;
        if let Poll::Ready(Err(e)) = self.drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonProtocolErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonProtocolErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        if let Some(replacement) = replacement(buf) {
            return self.start_replacement(cx, replacement, buf.len());
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    /// Vectored writes go straight through (hyper then queues head and body as separate
    /// buffers instead of copying them into one), except a write whose only non-empty buffer
    /// is one of hyper's bare error heads.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        let mut non_empty = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (non_empty.next(), non_empty.next())
            && let Some(replacement) = replacement(only)
        {
            return self.start_replacement(cx, replacement, only.len());
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Longest head hyper's bare error responses have (status line, `content-length: 0`, `date`,
/// `connection: close`: about 130 bytes); anything longer is not one of them.
const MAX_BARE_HEAD: usize = 256;

/// The JSON response replacing `buf`, when `buf` is one of hyper's automatic protocol error
/// responses (module docs).
fn replacement(buf: &[u8]) -> Option<Vec<u8>> {
    // Cheap checks first: every response the router writes passes through here.
    if buf.len() > MAX_BARE_HEAD || !buf.starts_with(b"HTTP/1.1 4") || !buf.ends_with(b"\r\n\r\n") {
        return None;
    }
    let head = std::str::from_utf8(buf).ok()?.strip_suffix("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let status: u16 = status_line
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()?;
    let mut date = None;
    let mut empty = false;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" => empty = value.trim() == "0",
            "date" => date = Some(value.trim()),
            "connection" => {}
            _ => return None,
        }
    }
    if !empty {
        return None;
    }
    let (code, message) = match status {
        400 => (
            "invalid_request",
            "the request is not valid HTTP/1.1: a malformed request line, header name or \
             value, or Content-Length",
        ),
        414 => ("uri_too_long", "the request target (URI) is too long"),
        431 => (
            "request_header_fields_too_large",
            "the request headers are too many or too large",
        ),
        _ => return None,
    };
    let body = error_body(Dialect::OpenAi, status, message, Some(code));
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n",
        body.len()
    );
    if let Some(date) = date {
        out.push_str(&format!("date: {date}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(&body);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_bare_error_heads_are_replaced() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\
                     date: Wed, 02 Dec 2026 16:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(bare).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("content-type: application/json"));
        assert!(head.contains("connection: close"));
        assert!(head.contains("date: Wed, 02 Dec 2026 16:00:00 GMT"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "request_header_fields_too_large");
        assert!(v["error"]["message"].as_str().unwrap().contains("headers"));

        // Not replaced: the router's own responses (a content type, a body), other statuses.
        assert!(
            replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n")
                .is_none()
        );
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(replacement(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}").is_none());
    }

    #[tokio::test]
    async fn vectored_writes_pass_through_and_bare_heads_are_still_replaced() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut wrapped = JsonProtocolErrors::new(server);
        // A normal response as hyper queues it: head and body in separate buffers.
        let head =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n";
        let bufs = [io::IoSlice::new(head), io::IoSlice::new(b"{}")];
        let mut sent = 0;
        while sent < head.len() + 2 {
            let n = wrapped.write_vectored(&bufs).await.unwrap();
            assert!(n > 0);
            sent += n;
            if n < head.len() + 2 {
                // duplex writes one buffer per call; write the rest plainly.
                let all = [&head[..], b"{}"].concat();
                wrapped.write_all(&all[sent..]).await.unwrap();
                sent = all.len();
            }
        }
        // A bare error head alone in a vectored write.
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        let n = wrapped
            .write_vectored(&[io::IoSlice::new(b""), io::IoSlice::new(bare)])
            .await
            .unwrap();
        assert_eq!(n, bare.len());
        wrapped.shutdown().await.unwrap();
        drop(wrapped);
        let mut got = String::new();
        let mut client = client;
        client.read_to_string(&mut got).await.unwrap();
        let (first, second) = got.split_at(head.len() + 2);
        assert_eq!(first.as_bytes(), [&head[..], b"{}"].concat().as_slice());
        assert!(
            second.starts_with("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json"),
            "{second}"
        );
        assert!(second.contains("\"invalid_request\""), "{second}");
    }
}
