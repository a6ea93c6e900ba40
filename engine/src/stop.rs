//! Stop strings: cut generated text at the first occurrence of any of a request's stop strings,
//! the way the OpenAI API does (the text before the stop string is returned, the stop string
//! itself is not).
//!
//! Text arrives as decoded deltas (see [`crate::tokenizer::StreamDecoder`]). A stop string can be
//! split across any number of deltas, so [`StopMatcher::push`] holds back the longest suffix of
//! the pending text that could still grow into a stop string, and emits everything before it.
//! When generation ends for another reason (EOS, length), [`StopMatcher::finish`] releases the
//! held-back text.
//!
//! Matching is on the decoded text, byte-exact (no normalisation, case-sensitive). When several
//! stop strings occur, the one that *completes first* in the text wins (ties: the one that starts
//! first). That choice makes the result independent of how the text was cut into deltas.

/// The most stop strings one request may carry (OpenAI allows 4; llama.cpp has no limit).
pub const MAX_STOP_STRINGS: usize = 16;

/// The longest stop string accepted, in bytes of UTF-8.
pub const MAX_STOP_LEN: usize = 512;

/// Why a list of stop strings was refused. All variants are caller errors (HTTP 422-style).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    /// A stop string was empty: it would match before any text.
    #[error("stop string {index} is empty")]
    Empty {
        /// Position of the offending string in the request's list.
        index: usize,
    },
    /// More than [`MAX_STOP_STRINGS`] stop strings.
    #[error("too many stop strings: {count} (at most {max})")]
    TooMany {
        /// How many were given.
        count: usize,
        /// The limit, [`MAX_STOP_STRINGS`].
        max: usize,
    },
    /// A stop string longer than [`MAX_STOP_LEN`] bytes.
    #[error("stop string {index} is {len} bytes long (at most {max})")]
    TooLong {
        /// Position of the offending string in the request's list.
        index: usize,
        /// Its length in bytes.
        len: usize,
        /// The limit, [`MAX_STOP_LEN`].
        max: usize,
    },
}

impl StopError {
    /// A stable label for metrics and error bodies.
    pub fn error_type(&self) -> &'static str {
        slotlight_otel::attr::value::ERROR_VALIDATION
    }
}

/// What [`StopMatcher::push`] produced for one delta.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutcome {
    /// Text that is safe to send to the client now (possibly empty).
    pub text: String,
    /// `Some(i)` when stop string `i` (index into the list given to [`StopMatcher::new`]) just
    /// matched: `text` then holds everything before it and generation should end.
    pub matched: Option<usize>,
}

impl StopOutcome {
    /// Whether a stop string matched and generation should end.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }
}

/// Finds stop strings in streamed text. One per request; see the module docs.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted: always shorter than the longest stop string, and
    /// always a possible start of one.
    held: String,
    /// Set once a stop string matched; later input is ignored.
    matched: Option<usize>,
}

impl Default for StopMatcher {
    /// A pass-through: no stop strings.
    fn default() -> Self {
        Self {
            stops: Vec::new(),
            held: String::new(),
            matched: None,
        }
    }
}

impl StopMatcher {
    /// Validates the stop strings (non-empty, at most [`MAX_STOP_STRINGS`], each at most
    /// [`MAX_STOP_LEN`] bytes). An empty list is valid and makes the matcher a pass-through.
    pub fn new(stops: &[String]) -> Result<Self, StopError> {
        if stops.len() > MAX_STOP_STRINGS {
            return Err(StopError::TooMany {
                count: stops.len(),
                max: MAX_STOP_STRINGS,
            });
        }
        for (index, s) in stops.iter().enumerate() {
            if s.is_empty() {
                return Err(StopError::Empty { index });
            }
            if s.len() > MAX_STOP_LEN {
                return Err(StopError::TooLong {
                    index,
                    len: s.len(),
                    max: MAX_STOP_LEN,
                });
            }
        }
        Ok(Self {
            stops: stops.to_vec(),
            held: String::new(),
            matched: None,
        })
    }

    /// The stop strings, in the order given to [`StopMatcher::new`].
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// Feeds newly decoded text. Returns the text that can be emitted now, holding back a
    /// suffix that may be the start of a stop string; reports a match when one completes.
    /// After a match every further call returns an empty outcome carrying the same match.
    pub fn push(&mut self, delta: &str) -> StopOutcome {
        if let Some(i) = self.matched {
            return StopOutcome {
                text: String::new(),
                matched: Some(i),
            };
        }
        if self.stops.is_empty() {
            return StopOutcome {
                text: delta.to_owned(),
                matched: None,
            };
        }
        self.held.push_str(delta);

        // Earliest-completing occurrence of any stop string; ties go to the earliest start.
        // The held text never contains a whole stop string (it would have matched earlier),
        // so searching it again with the new delta appended finds exactly the new matches.
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, index)
        for (i, stop) in self.stops.iter().enumerate() {
            if let Some(start) = self.held.find(stop.as_str()) {
                let cand = (start + stop.len(), start, i);
                if best.is_none_or(|b| (cand.0, cand.1) < (b.0, b.1)) {
                    best = Some(cand);
                }
            }
        }
        if let Some((_, start, i)) = best {
            self.matched = Some(i);
            let mut text = std::mem::take(&mut self.held);
            text.truncate(start);
            return StopOutcome {
                text,
                matched: Some(i),
            };
        }

        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        let text = std::mem::replace(&mut self.held, rest);
        StopOutcome {
            text,
            matched: None,
        }
    }

    /// Ends the stream: returns the held-back text (empty after a match).
    pub fn finish(&mut self) -> String {
        if self.matched.is_some() {
            self.held.clear();
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of some stop
    /// string. Such a suffix starts on a char boundary: it begins with the first byte of a stop
    /// string, which UTF-8 guarantees is not a continuation byte.
    fn partial_suffix_len(&self) -> usize {
        let held = self.held.as_bytes();
        let mut best = 0;
        for stop in &self.stops {
            let stop = stop.as_bytes();
            let max = (stop.len() - 1).min(held.len());
            for len in (best + 1..=max).rev() {
                if held[held.len() - len..] == stop[..len] {
                    best = len;
                    break;
                }
            }
        }
        debug_assert!(self.held.is_char_boundary(self.held.len() - best));
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        let stops: Vec<String> = stops.iter().map(|s| (*s).to_owned()).collect();
        StopMatcher::new(&stops).expect("valid stops")
    }

    /// Feeds the deltas; returns (all emitted text, matched index).
    fn run(m: &mut StopMatcher, deltas: &[&str]) -> (String, Option<usize>) {
        let mut out = String::new();
        for d in deltas {
            let o = m.push(d);
            out.push_str(&o.text);
            if o.matched.is_some() {
                return (out, o.matched);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    /// Reference: the answer computed on the whole text at once.
    fn reference(stops: &[&str], text: &str) -> (String, Option<usize>) {
        let mut best: Option<(usize, usize, usize)> = None;
        for (i, s) in stops.iter().enumerate() {
            if let Some(start) = text.find(s) {
                let c = (start + s.len(), start, i);
                if best.is_none_or(|b| (c.0, c.1) < (b.0, b.1)) {
                    best = Some(c);
                }
            }
        }
        match best {
            Some((_, start, i)) => (text[..start].to_owned(), Some(i)),
            None => (text.to_owned(), None),
        }
    }

    #[test]
    fn no_stops_is_a_pass_through() {
        let mut m = matcher(&[]);
        let o = m.push("hello");
        assert_eq!(o.text, "hello");
        assert!(!o.is_stopped());
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_in_one_delta() {
        let mut m = matcher(&["\n\n"]);
        let o = m.push("Hello\n\nWorld");
        assert_eq!(o.text, "Hello");
        assert_eq!(o.matched, Some(0));
        assert!(m.is_stopped());
        // Input after the stop is ignored.
        assert_eq!(m.push("more").text, "");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stop_split_across_many_deltas() {
        let mut m = matcher(&["<|END|>"]);
        let (out, matched) = run(&mut m, &["Hi", " there<", "|", "EN", "D", "|", ">", "tail"]);
        assert_eq!(out, "Hi there");
        assert_eq!(matched, Some(0));
    }

    #[test]
    fn held_text_is_released_when_the_prefix_breaks() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("abc ST").text, "abc ");
        assert_eq!(m.push("O").text, "");
        // "STOX" can no longer become "STOP".
        assert_eq!(m.push("X!").text, "STOX!");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn finish_flushes_a_dangling_prefix() {
        let mut m = matcher(&["###"]);
        assert_eq!(m.push("answer #").text, "answer ");
        assert_eq!(m.push("#").text, "");
        assert_eq!(m.finish(), "##");
    }

    #[test]
    fn overlapping_prefixes() {
        // "aab" inside "aaab": the held "aa" must not be thrown away when a third 'a' arrives.
        let mut m = matcher(&["aab"]);
        let (out, matched) = run(&mut m, &["x", "a", "a", "a", "b", "y"]);
        assert_eq!(out, "xa");
        assert_eq!(matched, Some(0));

        // A stop string that is a prefix of another: the shorter completes first.
        let mut m = matcher(&["abcd", "ab"]);
        let (out, matched) = run(&mut m, &["1a", "b", "cd"]);
        assert_eq!(out, "1");
        assert_eq!(matched, Some(1));

        // A later-starting stop string that completes first wins.
        let mut m = matcher(&["abcd", "bc"]);
        let (out, matched) = run(&mut m, &["abcd"]);
        assert_eq!(out, "a");
        assert_eq!(matched, Some(1));
    }

    #[test]
    fn unicode_stops() {
        let mut m = matcher(&["終了", "🛑"]);
        let (out, matched) = run(&mut m, &["日本語", "の終", "わり", "終", "了です"]);
        assert_eq!(out, "日本語の終わり");
        assert_eq!(matched, Some(0));

        let mut m = matcher(&["🛑"]);
        let (out, matched) = run(&mut m, &["é", "🛑", "x"]);
        assert_eq!(out, "é");
        assert_eq!(matched, Some(0));

        // A stop string sharing a leading byte pattern with other characters never splits a
        // character: everything emitted is valid text by construction (String), and the
        // total is right.
        let mut m = matcher(&["éa"]);
        let (out, matched) = run(&mut m, &["é", "é", "b", "é"]);
        assert_eq!(out, "éébé");
        assert_eq!(matched, None);
    }

    #[test]
    fn validation() {
        assert_eq!(
            StopMatcher::new(&[String::new()]).err(),
            Some(StopError::Empty { index: 0 })
        );
        let many = vec!["x".to_owned(); MAX_STOP_STRINGS + 1];
        assert!(matches!(
            StopMatcher::new(&many),
            Err(StopError::TooMany { .. })
        ));
        let long = vec!["ok".to_owned(), "y".repeat(MAX_STOP_LEN + 1)];
        let err = StopMatcher::new(&long).expect_err("too long");
        assert!(matches!(err, StopError::TooLong { index: 1, .. }));
        assert_eq!(
            err.to_string(),
            "stop string 1 is 513 bytes long (at most 512)"
        );
        assert_eq!(err.error_type(), "validation");
        assert!(StopMatcher::new(&vec!["y".repeat(MAX_STOP_LEN); MAX_STOP_STRINGS]).is_ok());
    }

    /// Every way of cutting a text into deltas gives the same answer as matching the whole text.
    #[test]
    fn chunking_independence() {
        let cases: &[(&[&str], &str)] = &[
            (&["abcd", "bc"], "xxabcdyy"),
            (&["abcd", "cd"], "xxabcdyy"),
            (&["aab", "ab"], "aaab"),
            (&["\n\n", "User:"], "Sure.\nUser: hi\n\n"),
            (&["stop"], "sto sto st stop"),
            (&["ñü", "üx"], "añüx"),
            (&["xyz"], "no match here xy"),
            (&["aaa"], "aaaa"),
        ];
        for (stops, text) in cases {
            let expected = reference(stops, text);
            let chars: Vec<(usize, char)> = text.char_indices().collect();
            // Single characters.
            let mut m = matcher(stops);
            let deltas: Vec<&str> = chars
                .iter()
                .map(|&(i, c)| &text[i..i + c.len_utf8()])
                .collect();
            assert_eq!(run(&mut m, &deltas), expected, "{stops:?} {text:?} by char");
            // Every two-way cut and a few three-way cuts.
            for a in 0..=chars.len() {
                let ia = chars.get(a).map_or(text.len(), |c| c.0);
                let mut m = matcher(stops);
                assert_eq!(
                    run(&mut m, &[&text[..ia], &text[ia..]]),
                    expected,
                    "{stops:?} {text:?} cut at {ia}"
                );
                for b in a..=chars.len() {
                    let ib = chars.get(b).map_or(text.len(), |c| c.0);
                    let mut m = matcher(stops);
                    assert_eq!(
                        run(&mut m, &[&text[..ia], &text[ia..ib], &text[ib..]]),
                        expected,
                        "{stops:?} {text:?} cuts at {ia},{ib}"
                    );
                }
            }
        }
    }

    #[test]
    fn emitted_text_never_contains_a_stop_prefix_at_its_end_before_finish() {
        let mut m = matcher(&["END"]);
        let o = m.push("the EN");
        assert_eq!(o.text, "the ");
        let o = m.push("DING");
        assert_eq!(o.text, "");
        assert_eq!(o.matched, Some(0));
    }
}
