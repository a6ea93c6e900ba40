//! A stored chain: each response keeps only its own part ([`Part`]) and a link to the stored
//! response its history and prompt are relative to, never the whole chain copied again, so a
//! chain of n turns stores O(n) bytes, not O(n²).
//!
//! A part's history is the last `inherited_items` items of its link's conversation (that
//! response's history, input and output), then its own `history`; its prompt is the first
//! `shared_tokens` ids of its link's prompt then reply ids, then its own `prompt_tokens`. A
//! continuation's prompt begins with its parent's prompt and reply ids, so it keeps only the
//! template's few ids between the turns and its new input's; one that rendered its prompt anew
//! (other tools, other instructions, a truncated history) shares fewer ids, or none, and keeps
//! more. A part without a link is self-contained (as every record written before chains were
//! kept this way is read).
//!
//! Reading walks the links up from the response asked for ([`rebuild`]), at most
//! [`MAX_CHAIN`] parts; a longer chain, a cycle, a missing link or counts its parents cannot
//! give are a [`StoreError::Chain`], never a hang or a panic. A save whose parent's chain is
//! already [`MAX_CHAIN`] long is stored self-contained, so a chain never outgrows it.
//!
//! Removing a response that still has stored children folds its part into each ([`fold_into`]):
//! the child then links where the removed one did (or is self-contained) and reads back the same.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{StoreError, StoredResponse};

/// The most responses one stored chain holds, the one read included.
pub const MAX_CHAIN: usize = 1024;

/// What the store keeps of one response: its own items and ids, relative to its link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// The response id.
    pub id: String,
    /// When it was created, Unix seconds.
    pub created_at: u64,
    /// The session of its chain.
    pub session: Option<String>,
    /// Its conversation, if any.
    pub conversation: Option<String>,
    /// The served model name.
    pub model: String,
    /// Its `instructions`.
    pub instructions: Option<String>,
    /// Its function tools.
    pub tools: Value,
    /// Its format and reasoning switch.
    pub format: Value,
    /// The response it continued, as it was saved (never changed by a fold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// The stored response its history and prompt are relative to; `None` when self-contained.
    /// Each backend keeps it beside the part (a column, a field), not in its body.
    #[serde(skip)]
    pub link: Option<String>,
    /// How many of the last items of its link's conversation begin its history.
    #[serde(default)]
    pub inherited_items: usize,
    /// Its history's items after those (its whole history when self-contained; a record of the
    /// earlier, full-copy form calls it `history`).
    #[serde(rename = "own_history", alias = "history")]
    pub history: Vec<Value>,
    /// Its own input items.
    pub input: Vec<Value>,
    /// Its output items.
    pub output: Vec<Value>,
    /// How many leading ids of its prompt are its link's prompt then reply ids.
    #[serde(default)]
    pub shared_tokens: usize,
    /// Its prompt's ids after those (its whole prompt when self-contained; a record of the
    /// earlier form calls it `prompt_tokens`).
    #[serde(rename = "own_prompt_tokens", alias = "prompt_tokens")]
    pub prompt_tokens: Vec<u32>,
    /// Its reply's ids.
    pub reply_tokens: Vec<u32>,
    /// The response object as it was returned.
    pub response: Value,
}

impl Part {
    /// `r` whole: a self-contained part.
    pub fn whole(r: &StoredResponse) -> Self {
        Self {
            history: r.history.clone(),
            prompt_tokens: r.prompt_tokens.clone(),
            ..Self::without_history(r)
        }
    }

    /// `r`'s own part linked to `parent` (stored, as read back whole): what `r` shares with it
    /// is kept as counts. Without a parent, `r` whole.
    pub fn of(r: &StoredResponse, parent: Option<&StoredResponse>) -> Self {
        let Some(parent) = parent else {
            return Self::whole(r);
        };
        let inherited = inherited_items(&r.history, &parent.conversation_items());
        let shared = shared_tokens(&r.prompt_tokens, parent);
        Self {
            link: Some(parent.id.clone()),
            inherited_items: inherited,
            history: r.history[inherited..].to_vec(),
            shared_tokens: shared,
            prompt_tokens: r.prompt_tokens[shared..].to_vec(),
            ..Self::without_history(r)
        }
    }

    /// `r` with neither history nor prompt ids, self-contained.
    fn without_history(r: &StoredResponse) -> Self {
        Self {
            id: r.id.clone(),
            created_at: r.created_at,
            session: r.session.clone(),
            conversation: r.conversation.clone(),
            model: r.model.clone(),
            instructions: r.instructions.clone(),
            tools: r.tools.clone(),
            format: r.format.clone(),
            previous: r.previous.clone(),
            link: None,
            inherited_items: 0,
            history: Vec::new(),
            input: r.input.clone(),
            output: r.output.clone(),
            shared_tokens: 0,
            prompt_tokens: Vec::new(),
            reply_tokens: r.reply_tokens.clone(),
            response: r.response.clone(),
        }
    }

    /// Its own items: its history's own items, its input, its output.
    fn own_items(&self) -> impl DoubleEndedIterator<Item = &Value> {
        self.history.iter().chain(&self.input).chain(&self.output)
    }

    fn own_items_len(&self) -> usize {
        self.history.len() + self.input.len() + self.output.len()
    }

    /// Its own ids of prompt then reply: its prompt's after the shared ones, then its reply's.
    fn own_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.prompt_tokens.iter().chain(&self.reply_tokens).copied()
    }

    fn own_ids_len(&self) -> usize {
        self.prompt_tokens.len() + self.reply_tokens.len()
    }
}

/// How many leading items of `history` are the last items of `parent_items`: all of them when
/// the history is the parent's conversation or its end (a truncated one), else none.
fn inherited_items(history: &[Value], parent_items: &[Value]) -> usize {
    match parent_items.len().checked_sub(history.len()) {
        Some(start) if parent_items[start..] == *history => history.len(),
        _ => 0,
    }
}

/// How many leading ids of `prompt` are `parent`'s prompt then reply ids.
fn shared_tokens(prompt: &[u32], parent: &StoredResponse) -> usize {
    prompt
        .iter()
        .zip(parent.prompt_tokens.iter().chain(&parent.reply_tokens))
        .take_while(|(a, b)| a == b)
        .count()
}

/// The response `chain[0]` whole, from its part and its ancestors' (`chain[i + 1]` is
/// `chain[i]`'s link; the last has none).
pub fn rebuild(chain: &[Part]) -> Result<StoredResponse, StoreError> {
    let Some(target) = chain.first() else {
        return Err(StoreError::Chain("an empty chain".into()));
    };
    check_links(chain)?;
    let history = rebuilt_history(chain)?;
    let prompt_tokens = rebuilt_prompt(chain)?;
    Ok(StoredResponse {
        id: target.id.clone(),
        created_at: target.created_at,
        session: target.session.clone(),
        conversation: target.conversation.clone(),
        model: target.model.clone(),
        instructions: target.instructions.clone(),
        tools: target.tools.clone(),
        format: target.format.clone(),
        previous: target.previous.clone(),
        history,
        input: target.input.clone(),
        output: target.output.clone(),
        prompt_tokens,
        reply_tokens: target.reply_tokens.clone(),
        response: target.response.clone(),
    })
}

/// Each part of `chain` links to the next, and the last to nothing.
fn check_links(chain: &[Part]) -> Result<(), StoreError> {
    for (i, p) in chain.iter().enumerate() {
        let next = chain.get(i + 1).map(|n| n.id.as_str());
        if p.link.as_deref() != next {
            return Err(broken(
                &chain[0].id,
                format!(
                    "`{}` links to {:?}, the chain read holds {next:?}",
                    p.id, p.link
                ),
            ));
        }
    }
    Ok(())
}

/// `chain[0]`'s whole history: the items it inherits, walked up, then its own.
fn rebuilt_history(chain: &[Part]) -> Result<Vec<Value>, StoreError> {
    let target = &chain[0];
    let mut need = target.inherited_items;
    // Counts come from the store: nothing is allocated from them before they are checked.
    let mut reversed: Vec<&Value> = Vec::new();
    let mut from = target;
    for parent in &chain[1..] {
        if need == 0 {
            break;
        }
        let own = need.min(parent.own_items_len());
        reversed.extend(parent.own_items().rev().take(own));
        need -= own;
        if need > parent.inherited_items {
            return Err(short(&target.id, &from.id, &parent.id, "items"));
        }
        from = parent;
    }
    if need > 0 {
        return Err(beyond_the_root(&target.id, &from.id, "items"));
    }
    Ok(reversed
        .into_iter()
        .rev()
        .chain(&target.history)
        .cloned()
        .collect())
}

/// `chain[0]`'s whole prompt: the ids it shares, walked up, then its own.
fn rebuilt_prompt(chain: &[Part]) -> Result<Vec<u32>, StoreError> {
    let target = &chain[0];
    let mut need = target.shared_tokens;
    // Each ancestor's own ids, nearest first; they are laid down farthest first.
    let mut pieces: Vec<(&Part, usize)> = Vec::new();
    let mut from = target;
    for parent in &chain[1..] {
        if need == 0 {
            break;
        }
        if need > parent.shared_tokens {
            let own = need - parent.shared_tokens;
            if own > parent.own_ids_len() {
                return Err(short(&target.id, &from.id, &parent.id, "token ids"));
            }
            pieces.push((parent, own));
            need = parent.shared_tokens;
        }
        from = parent;
    }
    if need > 0 {
        return Err(beyond_the_root(&target.id, &from.id, "token ids"));
    }
    let len = pieces.iter().map(|(_, own)| own).sum::<usize>() + target.prompt_tokens.len();
    let mut ids = Vec::with_capacity(len);
    for (p, own) in pieces.into_iter().rev() {
        ids.extend(p.own_ids().take(own));
    }
    ids.extend_from_slice(&target.prompt_tokens);
    Ok(ids)
}

/// Folds `parent`'s part into `child`'s, `parent` being removed: the child then links where
/// the parent did and reads back the same. `false` (and the child unchanged, its link left
/// pointing at the removed parent, so that reading it is an error) when the child asks for more
/// than the parent holds: it was damaged already.
pub fn fold_into(parent: &Part, child: &mut Part) -> bool {
    let own_items = parent.own_items_len();
    let fits_items = child.inherited_items <= own_items.saturating_add(parent.inherited_items);
    let own_ids = child.shared_tokens.saturating_sub(parent.shared_tokens);
    if !fits_items || own_ids > parent.own_ids_len() {
        return false;
    }
    let take = child.inherited_items.min(own_items);
    let folded: Vec<Value> = parent
        .own_items()
        .skip(own_items - take)
        .cloned()
        .chain(child.history.drain(..))
        .collect();
    child.history = folded;
    child.inherited_items -= take;
    if own_ids > 0 {
        let folded: Vec<u32> = parent
            .own_ids()
            .take(own_ids)
            .chain(child.prompt_tokens.drain(..))
            .collect();
        child.prompt_tokens = folded;
        child.shared_tokens = parent.shared_tokens;
    }
    child.link = parent.link.clone();
    true
}

/// Walks a chain up from `id`: `next(link)` reads a part (`None`: not stored). `Ok(None)` when
/// `id` itself is not stored; at most `limit` parts; a cycle or a missing link is an error.
pub fn walk(
    id: &str,
    limit: usize,
    mut next: impl FnMut(&str) -> Result<Option<Part>, StoreError>,
) -> Result<Option<Vec<Part>>, StoreError> {
    let mut chain: Vec<Part> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut at = Some(id.to_string());
    while let Some(cur) = at {
        if !seen.insert(cur.clone()) {
            return Err(broken(id, format!("it links back to `{cur}` (a cycle)")));
        }
        if chain.len() >= limit {
            return Err(broken(id, format!("it is longer than {limit} responses")));
        }
        let Some(part) = next(&cur)? else {
            if chain.is_empty() {
                return Ok(None);
            }
            return Err(broken(
                id,
                format!("it links to `{cur}`, which is not stored"),
            ));
        };
        at = part.link.clone();
        chain.push(part);
    }
    Ok(Some(chain))
}

/// The error of a broken chain.
pub fn broken(id: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Chain(format!("the stored chain of `{id}` is broken: {why}"))
}

/// The error of a part asking its parent for more than it holds.
fn short(id: &str, from: &str, parent: &str, what: &str) -> StoreError {
    broken(
        id,
        format!("`{from}` takes more {what} than its link `{parent}` holds"),
    )
}

/// The error of a chain whose root is asked for more than it holds.
fn beyond_the_root(id: &str, from: &str, what: &str) -> StoreError {
    broken(
        id,
        format!("`{from}` takes {what} from a link it does not have"),
    )
}

/// Whether `r` may link to the stored chain `parent_chain` (its parent's, parent first): not
/// when the chain is already [`MAX_CHAIN`] (`limit`) long, nor when it holds `r` itself (a
/// response replaced by one continuing its own descendant).
pub fn may_link(r: &StoredResponse, parent_chain: &[Part], limit: usize) -> bool {
    parent_chain.len() < limit && parent_chain.iter().all(|p| p.id != r.id)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::response;
    use super::super::{ResponseStore, unix_now};
    use super::*;
    use serde_json::json;

    /// The turn of [`turns`] whose history was truncated (its first items dropped).
    pub(crate) const TRUNCATED: usize = 10;
    /// The turn of [`turns`] whose prompt was rendered anew (it shares 3 ids with its parent).
    pub(crate) const RERENDERED: usize = 20;

    /// A turn `k` continuing `prev`, whole, as the handler builds it: its history is `prev`'s
    /// conversation, its prompt `prev`'s prompt and reply ids then its own.
    pub(crate) fn next_turn(prev: Option<&StoredResponse>, id: &str, k: usize) -> StoredResponse {
        let n = u32::try_from(k).expect("a small turn number");
        let mut r = response(id, Some("conv_chain"), 0);
        r.created_at = unix_now() - 1_000 + k as u64;
        r.previous = prev.map(|p| p.id.clone());
        r.history = prev
            .map(StoredResponse::conversation_items)
            .unwrap_or_default();
        r.input = vec![
            json!({"type": "message", "role": "user", "id": format!("msg_in_{id}"),
            "content": format!("turn {k} of {id}: {}", "words ".repeat(30))}),
        ];
        r.output = vec![json!({"type": "message", "role": "assistant",
            "id": format!("msg_out_{id}"), "status": "completed",
            "content": [{"type": "output_text", "text": format!("reply {k}, a / slash"),
                "annotations": [], "logprobs": [{"token": "a", "logprob": -0.123_456_789_012_345_67,
                "bytes": [97]}]}]})];
        r.prompt_tokens = prev
            .map(|p| [p.prompt_tokens.as_slice(), &p.reply_tokens].concat())
            .unwrap_or_default();
        r.prompt_tokens.extend((0..20u32).map(|i| 50_000 + i + n));
        r.reply_tokens = (0..20u32).map(|i| 100 * n + i).chain([2]).collect();
        r.response = json!({"id": id, "object": "response", "created_at": r.created_at,
            "output": r.output, "temperature": 0.7, "top_p": 1.0,
            "usage": {"input_tokens": r.prompt_tokens.len()}});
        r
    }

    /// A chain of `n` turns (`resp_t1` …), whole: turn [`TRUNCATED`] drops its history's first
    /// four items, turn [`RERENDERED`] renders its prompt anew.
    pub(crate) fn turns(n: usize) -> Vec<StoredResponse> {
        let mut chain: Vec<StoredResponse> = Vec::new();
        for k in 1..=n {
            let mut t = next_turn(chain.last(), &format!("resp_t{k}"), k);
            if k == TRUNCATED {
                t.history.drain(..4);
            }
            if k == RERENDERED {
                let len = t.prompt_tokens.len();
                t.prompt_tokens.truncate(3);
                t.prompt_tokens
                    .extend((3..len).map(|i| 70_000 + u32::try_from(i).expect("a short prompt")));
            }
            chain.push(t);
        }
        chain
    }

    /// Whether `s` reads back each of `expected` exactly, and each of `gone` not at all.
    pub(crate) async fn reads_back(s: &ResponseStore, expected: &[&StoredResponse], gone: &[&str]) {
        for t in expected {
            let got = s.get(&t.id).await.expect("get");
            let got = got.unwrap_or_else(|| panic!("{} is stored", t.id));
            assert_eq!(got.history, t.history, "{}'s history", t.id);
            assert_eq!(got.prompt_tokens, t.prompt_tokens, "{}'s prompt", t.id);
            assert_eq!(&got, *t, "{} whole", t.id);
            assert_eq!(
                serde_json::to_string(&got.response).expect("json"),
                serde_json::to_string(&t.response).expect("json"),
                "{}'s object, byte for byte",
                t.id
            );
        }
        for id in gone {
            assert_eq!(s.get(id).await.expect("get"), None, "{id} is gone");
        }
    }

    /// A chain of 30 turns: each stores its own part, whose bytes do not grow with the chain,
    /// and each reads back as its full copy. The figures are printed.
    pub(crate) async fn a_chain_is_kept_in_linear_bytes(s: &ResponseStore) {
        let chain = turns(30);
        let mut own = Vec::new();
        for t in &chain {
            s.put(t).await.expect("put");
            own.push(s.stored_bytes(&t.id).await.expect("bytes"));
        }
        reads_back(s, &chain.iter().collect::<Vec<_>>(), &[]).await;
        let full: Vec<u64> = chain
            .iter()
            .map(|t| serde_json::to_string(t).expect("json").len() as u64)
            .collect();
        let second = own[1];
        for (k, b) in own.iter().enumerate().map(|(i, b)| (i + 1, *b)) {
            if k != RERENDERED {
                assert!(
                    b <= second + second / 4,
                    "turn {k} stores {b} bytes, turn 2 {second}: {own:?}"
                );
            }
        }
        let (stored, copied) = (own.iter().sum::<u64>(), full.iter().sum::<u64>());
        assert!(
            stored * 5 < copied,
            "{stored} bytes stored, {copied} as copies"
        );
        eprintln!(
            "30 turns ({}): {stored} bytes as links (turn 2 {}, turn 30 {}), {copied} as full \
             copies (turn 2 {}, turn 30 {})",
            s.describe(),
            own[1],
            own[29],
            full[1],
            full[29]
        );
    }

    /// Deleting responses of a chain with a branch keeps every other one exact, and the
    /// newest continues.
    pub(crate) async fn deleting_keeps_the_children_exact(s: &ResponseStore) {
        let mut chain = turns(12);
        let branch = next_turn(Some(&chain[3]), "resp_b5", 5);
        let after_branch = next_turn(Some(&branch), "resp_b6", 6);
        for t in chain.iter().chain([&branch, &after_branch]) {
            s.put(t).await.expect("put");
        }
        let mut gone: Vec<String> = Vec::new();
        // The branch point (two children), the root, the branch's middle, the truncated turn
        // and the one before it, one after another.
        for id in [
            "resp_t4", "resp_t1", "resp_b5", "resp_t10", "resp_t9", "resp_t6",
        ] {
            assert!(s.delete(id).await.expect("delete"), "{id} was there");
            assert!(!s.delete(id).await.expect("delete again"), "{id} is gone");
            gone.push(id.to_string());
            let kept: Vec<&StoredResponse> = chain
                .iter()
                .chain([&branch, &after_branch])
                .filter(|t| !gone.contains(&t.id))
                .collect();
            let gone: Vec<&str> = gone.iter().map(String::as_str).collect();
            reads_back(s, &kept, &gone).await;
        }
        let next = next_turn(chain.last(), "resp_t13", 13);
        s.put(&next).await.expect("put");
        chain.push(next);
        reads_back(s, &[&chain[12]], &[]).await;
    }

    /// A store that keeps 5 responses: the oldest go, each folded into its child, and the
    /// rest read back exact.
    pub(crate) async fn evicting_by_count_keeps_the_rest_exact(s: &ResponseStore) {
        let chain = turns(12);
        for t in &chain {
            s.put(t).await.expect("put");
        }
        let gone: Vec<&str> = chain[..7].iter().map(|t| t.id.as_str()).collect();
        reads_back(s, &chain[7..].iter().collect::<Vec<_>>(), &gone).await;
    }

    /// A store bounded by `max_bytes`: what is kept is exact and within the bound, the newest
    /// always kept.
    pub(crate) async fn evicting_by_bytes_keeps_the_rest_exact(s: &ResponseStore, max_bytes: u64) {
        let chain = turns(30);
        for t in &chain {
            s.put(t).await.expect("put");
        }
        let mut kept = Vec::new();
        let mut gone = Vec::new();
        let mut bytes = 0;
        for t in &chain {
            match s.get(&t.id).await.expect("get") {
                Some(_) => {
                    kept.push(t);
                    bytes += s.stored_bytes(&t.id).await.expect("bytes");
                }
                None => gone.push(t.id.as_str()),
            }
        }
        assert!(!gone.is_empty(), "the bound dropped some");
        assert!(kept.len() > 1, "the bound kept some: {gone:?}");
        assert!(
            bytes <= max_bytes,
            "{bytes} bytes kept, the bound {max_bytes}"
        );
        assert_eq!(kept.last().map(|t| t.id.as_str()), Some("resp_t30"));
        reads_back(s, &kept, &gone).await;
    }

    /// Turns past the age bound are swept into their child when it is saved.
    pub(crate) async fn a_parent_past_its_age_is_swept_into_its_child(s: &ResponseStore) {
        let mut chain = turns(4);
        for t in &mut chain[..3] {
            t.created_at -= 7_200;
        }
        for t in &chain {
            s.put(t).await.expect("put");
        }
        reads_back(s, &[&chain[3]], &["resp_t1", "resp_t2", "resp_t3"]).await;
        let next = next_turn(Some(&chain[3]), "resp_t5", 5);
        s.put(&next).await.expect("put");
        reads_back(s, &[&chain[3], &next], &[]).await;
    }

    fn parts_of(chain: &[StoredResponse]) -> Vec<Part> {
        let mut parts: Vec<Part> = Vec::new();
        for (i, t) in chain.iter().enumerate() {
            let parent = i.checked_sub(1).map(|p| &chain[p]);
            parts.push(Part::of(t, parent));
        }
        parts
    }

    /// The chain of `parts[i]`, nearest first.
    fn chain_of(parts: &[Part], i: usize) -> Vec<Part> {
        let mut chain = Vec::new();
        let mut at = Some(parts[i].id.clone());
        while let Some(id) = at {
            let p = parts.iter().find(|p| p.id == id).expect("linked").clone();
            at = p.link.clone();
            chain.push(p);
        }
        chain
    }

    #[test]
    fn parts_keep_only_their_own_and_rebuild_whole() {
        let chain = turns(25);
        let parts = parts_of(&chain);
        for (i, t) in chain.iter().enumerate() {
            assert_eq!(rebuild(&chain_of(&parts, i)).expect("rebuild"), *t);
        }
        let second = &parts[1];
        assert_eq!(second.history, Vec::<Value>::new(), "all inherited");
        assert_eq!(second.inherited_items, 2);
        assert_eq!(second.prompt_tokens.len(), 20, "its own ids only");
        assert_eq!(
            parts[TRUNCATED - 1].inherited_items,
            chain[TRUNCATED - 1].history.len()
        );
        assert_eq!(parts[RERENDERED - 1].shared_tokens, 3);
    }

    #[test]
    fn folding_a_removed_parent_keeps_every_child_whole() {
        let chain = turns(25);
        // Each turn removed in turn (every other one, then the rest), its part folded into
        // its child, checked after each.
        let order: Vec<usize> = (0..24).step_by(2).chain((1..24).step_by(2)).collect();
        let mut parts = parts_of(&chain);
        for removed in order {
            let id = chain[removed].id.clone();
            let at = parts.iter().position(|p| p.id == id).expect("there");
            let parent = parts.remove(at);
            for child in parts.iter_mut().filter(|c| c.link.as_deref() == Some(&id)) {
                assert!(fold_into(&parent, child));
            }
            for t in &chain {
                if let Some(i) = parts.iter().position(|p| p.id == t.id) {
                    assert_eq!(rebuild(&chain_of(&parts, i)).expect("rebuild"), *t);
                }
            }
        }
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].link, None, "the last is self-contained");
    }

    #[test]
    fn a_broken_chain_is_an_error() {
        let chain = turns(3);
        let parts = parts_of(&chain);
        let read =
            |parts: Vec<Part>| move |id: &str| Ok(parts.iter().find(|p| p.id == id).cloned());
        // A missing link.
        let err = walk(
            "resp_t3",
            10,
            read(vec![parts[2].clone(), parts[0].clone()]),
        )
        .expect_err("a missing link");
        assert!(
            err.to_string().contains("`resp_t2`, which is not stored"),
            "{err}"
        );
        // A cycle.
        let mut looped = parts.clone();
        looped[0].link = Some("resp_t3".into());
        let err = walk("resp_t3", 10, read(looped)).expect_err("a cycle");
        assert!(err.to_string().contains("a cycle"), "{err}");
        // Too long.
        let err = walk("resp_t3", 2, read(parts.clone())).expect_err("too long");
        assert!(err.to_string().contains("longer than 2"), "{err}");
        // Not stored at all.
        assert!(
            walk("resp_x", 10, read(parts.clone()))
                .expect("walk")
                .is_none()
        );
        // A part asking for more than its parent holds.
        let mut greedy = parts.clone();
        greedy[2].shared_tokens += 1_000;
        let chain = walk("resp_t3", 10, read(greedy.clone()))
            .expect("walk")
            .expect("stored");
        let err = rebuild(&chain).expect_err("short of ids");
        assert!(err.to_string().contains("more token ids"), "{err}");
        let mut child = greedy[2].clone();
        assert!(!fold_into(&greedy[1], &mut child), "left as it is");
        assert_eq!(child, greedy[2]);
        // Counts as large as they come: errors, never an overflow or an allocation.
        let mut huge = parts.clone();
        huge[2].inherited_items = usize::MAX;
        huge[2].shared_tokens = usize::MAX;
        let up: Vec<Part> = huge.iter().rev().cloned().collect();
        let err = rebuild(&up).expect_err("huge counts");
        assert!(err.to_string().contains("takes more items"), "{err}");
        huge[2].inherited_items = 0;
        let up: Vec<Part> = huge.iter().rev().cloned().collect();
        let err = rebuild(&up).expect_err("huge counts");
        assert!(err.to_string().contains("takes more token ids"), "{err}");
        huge[2].inherited_items = usize::MAX;
        assert!(!fold_into(&huge[1].clone(), &mut huge[2]));
        let mut root = huge[2].clone();
        root.link = None;
        let err = rebuild(&[root]).expect_err("a root taking from a link");
        assert!(err.to_string().contains("does not have"), "{err}");
        let mut greedy = parts;
        greedy[2].inherited_items += 1_000;
        let chain = walk("resp_t3", 10, read(greedy))
            .expect("walk")
            .expect("stored");
        let err = rebuild(&chain).expect_err("short of items");
        assert!(err.to_string().contains("more items"), "{err}");
    }

    #[test]
    fn a_record_of_the_earlier_form_reads_as_self_contained() {
        let t = &turns(3)[2];
        // The full-copy form: `history` and `prompt_tokens` whole, no counts, no `previous`.
        let old = serde_json::to_string(&StoredResponse {
            previous: None,
            ..t.clone()
        })
        .expect("json");
        assert!(old.contains("\"history\"") && !old.contains("own_history"));
        let part: Part = serde_json::from_str(&old).expect("decode");
        assert_eq!(part.link, None);
        let back = rebuild(&[part]).expect("rebuild");
        assert_eq!(
            back,
            StoredResponse {
                previous: None,
                ..t.clone()
            }
        );
    }
}
