//! Slot indices of one group: the lowest free index is handed out first.

/// Which slot indices are taken.
#[derive(Debug, Clone)]
pub struct Slots {
    taken: Vec<bool>,
}

impl Slots {
    /// A group's `n` batch slots, all free.
    pub fn new(n: usize) -> Self {
        Self {
            taken: vec![false; n],
        }
    }

    /// Takes the lowest free slot.
    pub fn take(&mut self) -> Option<usize> {
        let i = self.taken.iter().position(|t| !t)?;
        self.taken[i] = true;
        Some(i)
    }

    /// Frees a slot.
    pub fn free(&mut self, i: usize) {
        if let Some(t) = self.taken.get_mut(i) {
            *t = false;
        }
    }
}
