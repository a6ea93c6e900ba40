//! Reasoning output: the `<think>…</think>` block of a thinking model's reply, split off into
//! `reasoning_content` (vLLM's and llama.cpp's field), the rest left as `content`.
//!
//! Whether a reply may hold reasoning is decided per request, from the chat template and the
//! prompt it rendered ([`ReasoningStart::detect`]):
//! - a template whose text has no `<think>` is not a thinking template: nothing is parsed, and
//!   the reply is exactly as before;
//! - a prompt that ends inside an opened `<think>` (templates that put `<think>\n` in the
//!   generation prompt) starts the reply in reasoning ([`ReasoningStart::Open`]);
//! - a prompt that ends with a closed `</think>` (Qwen 3 with `enable_thinking: false` renders an
//!   empty `<think>\n\n</think>`) has no reasoning to parse ([`ReasoningStart::Closed`]);
//! - otherwise the model may open the block itself: a reply whose first non-blank text is
//!   `<think>` starts in reasoning ([`ReasoningStart::MayOpen`]).
//!
//! The split follows llama.cpp's deepseek reasoning format: the reasoning is trimmed of
//! whitespace at both ends (an empty one is no reasoning at all), the content after
//! `</think>` loses its leading whitespace, and a reply whose `</think>` never arrives (cut by
//! `max_tokens`) is reasoning to its end. Streamed, the deltas add up to exactly that split:
//! text that may be the start of a tag, or whitespace that may turn out to be the reasoning's
//! end, is held back until the next token tells.
//!
//! Reasoning tokens are the generated tokens whose text lies in the block, from the `<think>`
//! tag (or the first token, when the prompt opened the block) to the `</think>` tag, both tags
//! included.

/// The tag that opens a reasoning block.
pub const THINK_OPEN: &str = "<think>";
/// The tag that closes it.
pub const THINK_CLOSE: &str = "</think>";

/// Where a reply of a thinking template starts, as the rendered prompt shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningStart {
    /// The prompt ends inside an opened `<think>`: the reply starts in reasoning.
    Open,
    /// The reply may open a `<think>` block as its first text.
    MayOpen,
    /// The prompt closed the block already (or a constraint rules it out): no reasoning.
    Closed,
}

impl ReasoningStart {
    /// How a reply to `prompt`, rendered by the template `template_source`, starts; `None` for
    /// a template without `<think>` (no reasoning parsing at all).
    pub fn detect(template_source: &str, prompt: &str) -> Option<Self> {
        if !template_source.contains(THINK_OPEN) {
            return None;
        }
        let tail = prompt.trim_end();
        Some(if tail.ends_with(THINK_OPEN) {
            ReasoningStart::Open
        } else if tail.ends_with(THINK_CLOSE) {
            ReasoningStart::Closed
        } else {
            ReasoningStart::MayOpen
        })
    }
}

/// Reasoning and content released by one step of the splitter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Text for `reasoning_content`.
    pub reasoning: String,
    /// Text for `content` (before tool-call parsing).
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing decided yet: the reply may still open with `<think>`.
    Start,
    /// Inside the block.
    Reasoning,
    /// After `</think>`: whitespace before the content is dropped.
    AfterClose,
    /// Content to the end.
    Content,
}

/// Splits one choice's text, token by token, into reasoning and content.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    state: State,
    /// Text received and not yet released.
    pending: String,
    /// Whether any reasoning text was released (leading whitespace is dropped until then).
    started: bool,
    /// Bytes of reply text received so far.
    received: usize,
    /// Where the block starts in the reply's text (its `<think>`, or 0 when the prompt opened it).
    open_at: Option<usize>,
    /// Where it ends (just after `</think>`).
    close_end: Option<usize>,
    /// Each token's text span in the reply: (start, end) byte offsets.
    tokens: Vec<(usize, usize)>,
}

impl ReasoningSplitter {
    /// A splitter for a reply that starts as `start` says.
    pub fn new(start: ReasoningStart) -> Self {
        let (state, open_at) = match start {
            ReasoningStart::Open => (State::Reasoning, Some(0)),
            ReasoningStart::MayOpen => (State::Start, None),
            ReasoningStart::Closed => (State::Content, None),
        };
        Self {
            state,
            pending: String::new(),
            started: false,
            received: 0,
            open_at,
            close_end: None,
            tokens: Vec::new(),
        }
    }

    /// Feeds the text of one generated token; returns what may be released now.
    pub fn push_token(&mut self, text: &str) -> Split {
        let start = self.received;
        self.tokens.push((start, start + text.len()));
        self.push_text(text)
    }

    /// Feeds text that belongs to no token of its own (the tail flushed at the end).
    fn push_text(&mut self, text: &str) -> Split {
        let base = self.received;
        self.received += text.len();
        // Offset in the reply of the first byte of `pending` once `text` is appended.
        let pending_at = base - self.pending.len();
        self.pending.push_str(text);
        let mut out = Split::default();
        self.advance(pending_at, &mut out, false);
        out
    }

    /// Ends the choice with the text still held by the engine (`tail`): what is left to
    /// release, and the number of reasoning tokens.
    pub fn finish(mut self, tail: &str) -> (Split, usize) {
        let mut out = self.push_text(tail);
        let pending_at = self.received - self.pending.len();
        self.advance(pending_at, &mut out, true);
        let count = self.reasoning_tokens();
        (out, count)
    }

    /// Tokens whose text lies in the block (tags included); an empty token counts when it
    /// falls inside.
    fn reasoning_tokens(&self) -> usize {
        let Some(open) = self.open_at else { return 0 };
        let close = self.close_end.unwrap_or(usize::MAX);
        self.tokens
            .iter()
            .filter(|&&(s, e)| {
                if s == e {
                    s >= open && s < close
                } else {
                    s < close && e > open
                }
            })
            .count()
    }

    fn emit_reasoning(&mut self, text: &str, out: &mut Split) {
        let text = if self.started {
            text
        } else {
            text.trim_start()
        };
        if !text.is_empty() {
            self.started = true;
            out.reasoning.push_str(text);
        }
    }

    /// Releases what `pending` (which starts at reply offset `at`) allows; at the end
    /// (`last`) everything held is released.
    fn advance(&mut self, mut at: usize, out: &mut Split, last: bool) {
        loop {
            match self.state {
                State::Start => {
                    let lead = self.pending.len() - self.pending.trim_start().len();
                    let rest = &self.pending[lead..];
                    if rest.starts_with(THINK_OPEN) {
                        self.open_at = Some(at + lead);
                        let skip = lead + THINK_OPEN.len();
                        self.pending.drain(..skip);
                        at += skip;
                        self.state = State::Reasoning;
                        continue;
                    }
                    if !last && THINK_OPEN.starts_with(rest) {
                        // Blank so far, or the start of the tag: wait for more.
                        return;
                    }
                    self.state = State::Content;
                }
                State::Reasoning => {
                    if let Some(p) = self.pending.find(THINK_CLOSE) {
                        let end = p + THINK_CLOSE.len();
                        let piece: String = self.pending[..p].trim_end().to_string();
                        self.emit_reasoning(&piece, out);
                        self.pending.drain(..end);
                        self.close_end = Some(at + end);
                        at += end;
                        self.state = State::AfterClose;
                        continue;
                    }
                    let upto = if last {
                        self.pending.trim_end().len()
                    } else {
                        // Hold back a possible start of `</think>`, and trailing whitespace
                        // (the block's end would trim it).
                        let keep = tag_prefix_len(&self.pending, THINK_CLOSE);
                        self.pending[..self.pending.len() - keep].trim_end().len()
                    };
                    let piece: String = self.pending[..upto].to_string();
                    self.emit_reasoning(&piece, out);
                    self.pending.drain(..upto);
                    if last {
                        self.pending.clear();
                    }
                    return;
                }
                State::AfterClose => {
                    let lead = self.pending.len() - self.pending.trim_start().len();
                    self.pending.drain(..lead);
                    if self.pending.is_empty() {
                        return;
                    }
                    self.state = State::Content;
                }
                State::Content => {
                    out.content.push_str(&self.pending);
                    self.pending.clear();
                    return;
                }
            }
        }
    }
}

/// The length of the longest proper suffix of `text` that begins `tag`.
fn tag_prefix_len(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| {
            text.len() >= k
                && text.is_char_boundary(text.len() - k)
                && tag.starts_with(&text[text.len() - k..])
        })
        .unwrap_or(0)
}

/// Splits a whole reply at once (what the streamed deltas add up to).
pub fn split(start: ReasoningStart, text: &str) -> Split {
    let mut s = ReasoningSplitter::new(start);
    let mut out = s.push_text(text);
    let (rest, _) = s.finish("");
    out.reasoning.push_str(&rest.reasoning);
    out.content.push_str(&rest.content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(start: ReasoningStart, text: &str) -> (String, String) {
        let s = split(start, text);
        (s.reasoning, s.content)
    }

    /// Streams `tokens` one by one; returns the concatenated reasoning and content, every
    /// delta, and the reasoning-token count.
    fn streamed(start: ReasoningStart, tokens: &[&str]) -> (String, String, Vec<Split>, usize) {
        let mut s = ReasoningSplitter::new(start);
        let mut deltas = Vec::new();
        for t in tokens {
            deltas.push(s.push_token(t));
        }
        let (rest, count) = s.finish("");
        deltas.push(rest);
        let r = deltas.iter().map(|d| d.reasoning.as_str()).collect();
        let c = deltas.iter().map(|d| d.content.as_str()).collect();
        (r, c, deltas, count)
    }

    #[test]
    fn whole_replies_split_like_llama_cpp_deepseek() {
        use ReasoningStart::*;
        let cases: &[(ReasoningStart, &str, &str, &str)] = &[
            // (start, reply, reasoning, content)
            (
                MayOpen,
                "<think>\nLet me see.\n</think>\n\nIt is 4.",
                "Let me see.",
                "It is 4.",
            ),
            (MayOpen, "  \n<think>a b</think>c ", "a b", "c "),
            (MayOpen, "No thinking here.", "", "No thinking here."),
            (MayOpen, " Hi <think>x</think>", "", " Hi <think>x</think>"),
            (MayOpen, "<thin", "", "<thin"),
            (MayOpen, "<think></think>\n\nAnswer", "", "Answer"),
            (MayOpen, "", "", ""),
            (
                Open,
                "step one\nstep two\n</think>\n\nDone",
                "step one\nstep two",
                "Done",
            ),
            (Open, "\n  cut by length  ", "cut by length", ""),
            (Open, "unterminated </thi", "unterminated </thi", ""),
            (Open, "</think>", "", ""),
            (Closed, "<think>x</think>y", "", "<think>x</think>y"),
            (MayOpen, "<think> é🙂 </think>\u{3000}中", "é🙂", "中"),
        ];
        for (start, reply, reasoning, content) in cases {
            assert_eq!(
                whole(*start, reply),
                (reasoning.to_string(), content.to_string()),
                "{start:?} {reply:?}"
            );
        }
    }

    #[test]
    fn streamed_deltas_add_up_to_the_whole_split_at_every_boundary() {
        use ReasoningStart::*;
        let replies = [
            (MayOpen, "<think>\nLet me see.  \n</think>\n\nIt is 4. "),
            (MayOpen, " <think> a </think> b"),
            (MayOpen, "plain <th answer"),
            (Open, "  r1\n\n r2 </think>\n content </think>"),
            (Open, "no end < /think> <"),
            (MayOpen, "<think>\u{3000}é🙂 x\n</think>\n中 文"),
        ];
        for (start, reply) in replies {
            let expected = whole(start, reply);
            // One character per token: every tag is split across tokens.
            let chars: Vec<String> = reply.chars().map(String::from).collect();
            let tokens: Vec<&str> = chars.iter().map(String::as_str).collect();
            let (r, c, deltas, _) = streamed(start, &tokens);
            assert_eq!((r, c), expected, "{reply:?} char by char");
            // Where the split holds no `<` or `>`, no delta ever carries part of a tag.
            let tagless = |s: &str| !s.contains(['<', '>']);
            if tagless(&expected.0) && tagless(&expected.1) {
                for d in &deltas {
                    assert!(
                        tagless(&d.reasoning) && tagless(&d.content),
                        "{reply:?}: delta {d:?} leaks part of a tag"
                    );
                }
            }
            // Every split into two tokens.
            for cut in (0..=reply.len()).filter(|&i| reply.is_char_boundary(i)) {
                let (r, c, _, _) = streamed(start, &[&reply[..cut], &reply[cut..]]);
                assert_eq!((r, c), expected, "{reply:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn reasoning_is_released_as_it_streams() {
        let (_, _, deltas, count) = streamed(
            ReasoningStart::MayOpen,
            &[
                "<", "think", ">\n", "Let", " me", "\n</", "think", ">", "\n\n", "Four", ".",
            ],
        );
        let r: Vec<&str> = deltas.iter().map(|d| d.reasoning.as_str()).collect();
        let c: Vec<&str> = deltas.iter().map(|d| d.content.as_str()).collect();
        assert_eq!(r, ["", "", "", "Let", " me", "", "", "", "", "", "", ""]);
        assert_eq!(c, ["", "", "", "", "", "", "", "", "", "Four", ".", ""]);
        // `<`, `think`, `>\n`, `Let`, ` me`, `\n</`, `think`, `>`: the tags included.
        assert_eq!(count, 8);
    }

    #[test]
    fn reasoning_tokens_are_counted_from_the_block_to_its_close() {
        // Opened by the prompt and cut by length: every token is reasoning, empty ones too.
        let (_, _, _, n) = streamed(ReasoningStart::Open, &["a", "", " b", "\n"]);
        assert_eq!(n, 4);
        // Opened by the prompt, closed by a token that also starts the content.
        let (r, c, _, n) = streamed(ReasoningStart::Open, &["a", "</think>\n\nX", "Y"]);
        assert_eq!((r.as_str(), c.as_str(), n), ("a", "XY", 2));
        // Whitespace before the model's own `<think>` is not reasoning.
        let (_, _, _, n) = streamed(
            ReasoningStart::MayOpen,
            &["\n", "<think>", "a", "</think>", "b"],
        );
        assert_eq!(n, 3);
        // No block: no reasoning tokens.
        let (_, c, _, n) = streamed(ReasoningStart::MayOpen, &["<thi", "s is", " text"]);
        assert_eq!((c.as_str(), n), ("<this is text", 0));
        let (_, _, _, n) = streamed(ReasoningStart::Closed, &["<think>", "x"]);
        assert_eq!(n, 0);
    }

    #[test]
    fn the_prompt_tail_decides_where_the_reply_starts() {
        let thinking = "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}";
        assert_eq!(ReasoningStart::detect("{{ x }}", "<think>\n"), None);
        assert_eq!(
            ReasoningStart::detect(thinking, "<|im_start|>assistant\n<think>\n"),
            Some(ReasoningStart::Open)
        );
        assert_eq!(
            ReasoningStart::detect(thinking, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            Some(ReasoningStart::Closed)
        );
        assert_eq!(
            ReasoningStart::detect(thinking, "<|im_start|>assistant\n"),
            Some(ReasoningStart::MayOpen)
        );
        // A `<think>` typed by the user earlier in the prompt does not open the reply.
        assert_eq!(
            ReasoningStart::detect(thinking, "user: <think>\n<|im_start|>assistant\n"),
            Some(ReasoningStart::MayOpen)
        );
    }
}
