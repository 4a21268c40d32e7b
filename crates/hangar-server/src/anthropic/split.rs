//! A generation's text as the Messages API's blocks: reasoning and answer.
//!
//! The engines here write a reasoning model's thinking into the text, as the model does: the
//! answer opens (after whitespace) with `<think>`, and the reasoning runs to `</think>`. A
//! text that does not open so is all answer. Pieces arrive as generated; what could still
//! turn out to be a tag, or whitespace around the reasoning, is held back until it is known.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A piece of the answer, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Reasoning.
    Thinking(String),
    /// Answer text.
    Text(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the text may still open with `<think>`.
    Start,
    /// After `<think>`, before the reasoning's first non-whitespace.
    BeforeThinking,
    /// Inside the reasoning.
    Thinking,
    /// After the reasoning, before the answer's first non-whitespace.
    AfterThinking,
    /// The answer.
    Answer,
}

/// Splits a generation's text into [`Piece`]s as it arrives.
#[derive(Debug)]
pub(crate) struct Splitter {
    state: State,
    held: String,
}

impl Splitter {
    /// A splitter that looks for reasoning; `false` makes everything answer text (a request
    /// that turned thinking off).
    pub(crate) fn new(reasoning: bool) -> Self {
        let state = if reasoning { State::Start } else { State::Answer };
        Self { state, held: String::new() }
    }

    /// The pieces `text` completes.
    pub(crate) fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.held.trim_start();
                    if trimmed.len() < OPEN.len() && OPEN.starts_with(trimmed) {
                        return out;
                    }
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::BeforeThinking;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => {
                    if let Some(at) = self.held.find(CLOSE) {
                        let rest = self.held.split_off(at + CLOSE.len());
                        self.held.truncate(at);
                        push_piece(&mut out, Piece::Thinking(self.held.trim_end().to_owned()));
                        self.held = rest;
                        self.state = State::AfterThinking;
                        continue;
                    }
                    // Hold back what may start the closing tag, and the whitespace before it.
                    let partial = (1..CLOSE.len())
                        .rev()
                        .find(|&n| self.held.ends_with(&CLOSE[..n]))
                        .unwrap_or(0);
                    let body = &self.held[..self.held.len() - partial];
                    let keep = partial + (body.len() - body.trim_end().len());
                    let emit = self.held.len() - keep;
                    let rest = self.held.split_off(emit);
                    push_piece(&mut out, Piece::Thinking(std::mem::replace(&mut self.held, rest)));
                    return out;
                }
                State::BeforeThinking | State::AfterThinking => {
                    let trimmed = self.held.trim_start();
                    if trimmed.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = trimmed.to_owned();
                    self.state = if self.state == State::BeforeThinking {
                        State::Thinking
                    } else {
                        State::Answer
                    };
                }
                State::Answer => {
                    push_piece(&mut out, Piece::Text(std::mem::take(&mut self.held)));
                    return out;
                }
            }
        }
    }

    /// What is still held when the generation ended: reasoning cut short stays reasoning.
    pub(crate) fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Start | State::Answer => push_piece(&mut out, Piece::Text(held)),
            State::Thinking => push_piece(&mut out, Piece::Thinking(held.trim_end().to_owned())),
            State::BeforeThinking | State::AfterThinking => {}
        }
        out
    }
}

fn push_piece(out: &mut Vec<Piece>, piece: Piece) {
    let empty = match &piece {
        Piece::Thinking(t) | Piece::Text(t) => t.is_empty(),
    };
    if !empty {
        out.push(piece);
    }
}

/// The signature of a thinking block: a checksum of its text (FNV-1a, 64 bits). Hangar keeps
/// no secret and reads no reasoning back (earlier turns' reasoning is left out of the
/// prompt), so it needs no more than a stable token that clients can send back.
pub(crate) fn signature(thinking: &str) -> String {
    let hash = thinking
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    format!("hangar-fnv1a-{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All pieces of `parts`, merged by kind as a client would show them.
    fn split(reasoning: bool, parts: &[&str]) -> Vec<Piece> {
        let mut splitter = Splitter::new(reasoning);
        let mut pieces: Vec<Piece> = parts.iter().flat_map(|p| splitter.push(p)).collect();
        pieces.extend(splitter.finish());
        let mut merged: Vec<Piece> = Vec::new();
        for piece in pieces {
            match (merged.last_mut(), piece) {
                (Some(Piece::Thinking(a)), Piece::Thinking(b))
                | (Some(Piece::Text(a)), Piece::Text(b)) => {
                    a.push_str(&b);
                }
                (_, piece) => merged.push(piece),
            }
        }
        merged
    }

    fn thinking(s: &str) -> Piece {
        Piece::Thinking(s.to_owned())
    }

    fn text(s: &str) -> Piece {
        Piece::Text(s.to_owned())
    }

    #[test]
    fn reasoning_and_answer_split_wherever_the_pieces_break() {
        let whole = "<think>\nFirst, add. 2 + 2 = 4.\n</think>\n\nThe answer is 4.";
        let expected = vec![thinking("First, add. 2 + 2 = 4."), text("The answer is 4.")];
        assert_eq!(split(true, &[whole]), expected);
        // Every split of the text into two pieces, and one character at a time.
        for at in (0..=whole.len()).filter(|&i| whole.is_char_boundary(i)) {
            assert_eq!(split(true, &[&whole[..at], &whole[at..]]), expected, "split at {at}");
        }
        let chars: Vec<String> = whole.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split(true, &chars), expected);
    }

    #[test]
    fn text_without_reasoning_is_all_answer() {
        assert_eq!(
            split(true, &["  Hello", " <think>not at the start</think>"]),
            vec![text("  Hello <think>not at the start</think>")]
        );
        assert_eq!(split(true, &["<thi", "nk-ish"]), vec![text("<think-ish")]);
        assert_eq!(split(false, &["<think>x</think>y"]), vec![text("<think>x</think>y")]);
        assert_eq!(split(true, &[]), vec![]);
        assert_eq!(split(true, &["<th"]), vec![text("<th")]);
    }

    #[test]
    fn reasoning_cut_short_stays_reasoning_and_an_empty_answer_is_none() {
        assert_eq!(
            split(true, &["<think> still going </thi"]),
            vec![thinking("still going </thi")]
        );
        assert_eq!(split(true, &["<think>done</think>\n\n"]), vec![thinking("done")]);
        assert_eq!(split(true, &["<think></think>answer"]), vec![text("answer")]);
    }

    #[test]
    fn signatures_are_stable_and_differ_by_text() {
        assert_eq!(signature("a"), signature("a"));
        assert_ne!(signature("a"), signature("b"));
        assert!(signature("").starts_with("hangar-fnv1a-"));
    }
}
