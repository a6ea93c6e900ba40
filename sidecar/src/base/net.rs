//! IP networks: the entries of `--allow-otlp-from`, which the receivers' allow list holds.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An IP network (`10.0.0.0/8`, `::1/128`) or a single address (`192.168.1.7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// True when `ip` lies inside this network. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`)
    /// match IPv4 networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                32,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(net.to_bits(), ip.to_bits(), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, width: u32, prefix: u8) -> bool {
    let prefix = u32::from(prefix);
    if prefix == 0 {
        return true;
    }
    let shift = width - prefix;
    (a >> shift) == (b >> shift)
}

/// Why an allow-list entry did not parse.
#[derive(Debug, thiserror::Error)]
#[error("not an IP address or CIDR network: {0:?}")]
pub struct IpNetParseError(String);

impl FromStr for IpNet {
    type Err = IpNetParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IpNetParseError(s.to_string());
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().map_err(|_| err())?,
            None => max,
        };
        if prefix > max {
            return Err(err());
        }
        Ok(IpNet { addr, prefix })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn cidr_matching() {
        let n: IpNet = "10.0.0.0/8".parse().expect("cidr");
        assert!(n.contains(ip("10.1.2.3")));
        assert!(!n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.9.9.9")));
        let one: IpNet = "192.168.1.7".parse().expect("ip");
        assert!(one.contains(ip("192.168.1.7")));
        assert!(!one.contains(ip("192.168.1.8")));
        let v6: IpNet = "fd00::/8".parse().expect("v6");
        assert!(v6.contains(ip("fd12::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        let all: IpNet = "0.0.0.0/0".parse().expect("all");
        assert!(all.contains(ip("8.8.8.8")));
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("banana".parse::<IpNet>().is_err());
    }
}
