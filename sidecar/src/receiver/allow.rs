//! The receivers' source filter (`--allow-otlp-from`).

use std::net::IpAddr;

use crate::base::net::IpNet;

/// The receivers' source filter. Empty means everyone may send.
#[derive(Debug, Clone, Default)]
pub struct AllowList(Vec<IpNet>);

impl AllowList {
    /// A filter over `nets` (empty: allow all).
    pub fn new(nets: Vec<IpNet>) -> Self {
        AllowList(nets)
    }

    /// True when `ip` may send OTLP. An unknown peer passes only an empty list.
    pub fn allows(&self, ip: Option<IpAddr>) -> bool {
        if self.0.is_empty() {
            return true;
        }
        ip.is_some_and(|ip| self.0.iter().any(|n| n.contains(ip)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn allow_list() {
        assert!(AllowList::default().allows(None));
        let l = AllowList::new(vec!["127.0.0.1".parse().expect("ip")]);
        assert!(l.allows(Some(ip("127.0.0.1"))));
        assert!(!l.allows(Some(ip("127.0.0.2"))));
        assert!(!l.allows(None));
    }
}
