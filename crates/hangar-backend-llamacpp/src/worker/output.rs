//! Routing generated text: content goes through the request's stop sequences to the client
//! ([`StopStream`]); with tools, everything from [`TOOL_CALL_OPEN`] on becomes the tool call
//! ([`Output`]).

use hangar_backend::ToolCall;

use crate::prompt::TOOL_CALL_OPEN;
use crate::structured::{self, Constraint};

/// Routes generated text: content through the stop sequences to the client, and, when the
/// request has tools, everything from [`TOOL_CALL_OPEN`] on into the tool call.
pub(super) struct Output {
    /// Content, with the request's stop sequences.
    content: StopStream,
    /// Watches the content for the start of a tool call (tools only).
    opener: Option<StopStream>,
    /// The call's text after [`TOOL_CALL_OPEN`], once the model started one.
    call: Option<String>,
    /// Functions a call may name.
    names: Vec<String>,
}

impl Output {
    pub(super) fn new(stops: &[String], constraint: &Constraint) -> Self {
        let (opener, names) = match constraint {
            Constraint::Tools { names, .. } => {
                (Some(StopStream::with(vec![TOOL_CALL_OPEN.to_owned()])), names.clone())
            }
            _ => (None, Vec::new()),
        };
        Self { content: StopStream::new(stops), opener, call: None, names }
    }

    /// Adds a piece; returns the content to send now and whether a stop sequence ended it.
    pub(super) fn push(&mut self, piece: &str) -> (String, bool) {
        if let Some(call) = &mut self.call {
            call.push_str(piece);
            return (String::new(), false);
        }
        let Some(opener) = &mut self.opener else {
            return self.content.push(piece);
        };
        let (text, opened) = opener.push(piece);
        let (out, stopped) = self.content.push(&text);
        if opened && !stopped {
            self.call = Some(opener.take_after());
        }
        (out, stopped)
    }

    /// The position in the request's stop sequences of the one that ended the content.
    pub(super) fn stop_sequence(&self) -> Option<usize> {
        self.content.matched()
    }

    /// Ends the output: the content still held back, and the tool call if the model wrote a
    /// complete one. An incomplete call (cut by `max_tokens` or the context's end) is
    /// returned as content, as written.
    pub(super) fn finish(&mut self) -> (String, Option<ToolCall>) {
        if let Some(call) = self.call.take() {
            return match structured::parse_call(&call, &self.names) {
                Some(parsed) => (self.content.finish(""), Some(parsed)),
                None => (self.content.finish(&format!("{TOOL_CALL_OPEN}{call}")), None),
            };
        }
        if self.content.stopped {
            return (String::new(), None);
        }
        let held = self.opener.as_mut().map(|o| o.finish("")).unwrap_or_default();
        let (mut out, stopped) = self.content.push(&held);
        if !stopped {
            out.push_str(&self.content.finish(""));
        }
        (out, None)
    }
}

/// Streams generated text while holding back what could be the start of a stop sequence.
#[derive(Debug)]
pub(super) struct StopStream {
    stops: Vec<String>,
    held: String,
    /// What followed the stop sequence in the text pushed so far.
    after: String,
    stopped: bool,
    /// The position in `stops` of the sequence that stopped it.
    matched: Option<usize>,
}

impl StopStream {
    pub(super) fn new(stops: &[String]) -> Self {
        Self::with(stops.to_vec())
    }

    pub(super) fn with(stops: Vec<String>) -> Self {
        // Empty sequences stay in place (so positions are the request's) and never match.
        Self { stops, held: String::new(), after: String::new(), stopped: false, matched: None }
    }

    /// The position of the stop sequence that ended the stream, once one did.
    pub(super) fn matched(&self) -> Option<usize> {
        self.matched
    }

    /// The text that followed the stop sequence (after [`Self::push`] reported a stop).
    pub(super) fn take_after(&mut self) -> String {
        std::mem::take(&mut self.after)
    }

    /// Adds `piece`; returns what may be emitted now and whether a stop sequence completed
    /// (the text before it is emitted, the stop sequence and what follows are not).
    pub(super) fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        let found = self
            .stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, s.len(), i)))
            .min();
        if let Some((at, len, i)) = found {
            self.after = self.held.split_off(at + len);
            self.held.truncate(at);
            self.stopped = true;
            self.matched = Some(i);
            return (std::mem::take(&mut self.held), true);
        }
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|&n| s.is_char_boundary(n))
                    .filter(|&n| self.held.ends_with(&s[..n]))
            })
            .max()
            .unwrap_or(0);
        let emit = self.held.len() - keep;
        let rest = self.held.split_off(emit);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// Flushes what was held back, plus `tail` (undecodable trailing bytes).
    pub(super) fn finish(&mut self, tail: &str) -> String {
        let mut out = std::mem::take(&mut self.held);
        out.push_str(tail);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| (*s).to_owned()).collect();
        let mut stream = StopStream::new(&stops);
        let mut out = String::new();
        for piece in pieces {
            let (emit, stopped) = stream.push(piece);
            out.push_str(&emit);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&stream.finish(""));
        (out, false)
    }

    #[test]
    fn stop_sequences_cut_the_text_even_across_pieces() {
        assert_eq!(run(&["END"], &["ab", "cE", "N", "Dxyz"]), ("abc".to_owned(), true));
        assert_eq!(run(&["END"], &["ab", "cE", "N"]), ("abcEN".to_owned(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_owned(), false));
        assert_eq!(run(&["x", "bc"], &["abcx"]), ("a".to_owned(), true));
    }

    #[test]
    fn the_matched_sequence_is_the_earliest_in_the_text_at_its_request_position() {
        let stops: Vec<String> = ["", "zz", "c", "b"].map(str::to_owned).to_vec();
        let mut stream = StopStream::new(&stops);
        assert_eq!(stream.push("abczz"), ("a".to_owned(), true));
        assert_eq!(stream.matched(), Some(3));
        let mut none = StopStream::new(&stops);
        assert_eq!(none.push("aaa"), ("aaa".to_owned(), false));
        assert_eq!(none.matched(), None);
    }

    /// Pushes `pieces` through an [`Output`] for tools; returns the content sent and the call.
    fn route(pieces: &[&str], stops: &[&str]) -> (String, Option<ToolCall>) {
        let stops: Vec<String> = stops.iter().map(|s| (*s).to_owned()).collect();
        let constraint = Constraint::Tools {
            grammar: String::new(),
            lazy: true,
            names: vec!["get_weather".to_owned()],
        };
        let mut output = Output::new(&stops, &constraint);
        let mut content = String::new();
        for piece in pieces {
            let (text, stopped) = output.push(piece);
            content.push_str(&text);
            if stopped {
                break;
            }
        }
        let (rest, call) = output.finish();
        content.push_str(&rest);
        (content, call)
    }

    #[test]
    fn tool_calls_are_routed_out_of_the_content_even_across_pieces() {
        let call = r#"{"name": "get_weather", "arguments": {"unit": "c"}}"#;
        let (content, parsed) =
            route(&["Let me check. <tool", "_call>\n", call, "\n</tool_call>"], &[]);
        assert_eq!(content, "Let me check. ");
        let parsed = parsed.expect("a complete call");
        assert_eq!(
            (parsed.name.as_str(), parsed.arguments.as_str()),
            ("get_weather", r#"{"unit":"c"}"#)
        );
        // A call cut short (max_tokens) is returned as the text the model wrote.
        let (content, parsed) = route(&["a <tool_call>\n{\"name\": \"get_w"], &[]);
        assert_eq!((content.as_str(), parsed), ("a <tool_call>\n{\"name\": \"get_w", None));
        // Text that only looks like the start of a tag is released at the end.
        assert_eq!(route(&["x <tool"], &[]), ("x <tool".to_owned(), None));
        // Stop sequences still cut the content before a call.
        assert_eq!(route(&["ab STOP <tool_call>", call], &["STOP"]), ("ab ".to_owned(), None));
    }
}
