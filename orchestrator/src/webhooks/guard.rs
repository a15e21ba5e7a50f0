//! Callback safety: a client's `Saga-Callback-Url` may not make the server call inside its own
//! network (SPEC §8). Anyone who may start a saga chooses that URL, and the relay POSTs every
//! event of the saga to it, so an unchecked URL lets a client reach the server's loopback
//! services, its cloud metadata endpoint or any private host it can route to.
//!
//! A host that is, or resolves to, a loopback, private, link-local, unspecified (or otherwise
//! not globally routable) address is refused unless the operator allowed it by name
//! ([`CallbackPolicy::allow`], `--allow-callback-host`). The check is made when the saga
//! starts ([`CallbackPolicy::check`]: `422 callback_url_not_allowed`), and again at every
//! delivery, because a name may resolve elsewhere later (DNS rebinding): the relay sends
//! callbacks through a client whose resolver (`GuardedResolver`) refuses such addresses, and
//! checks literal addresses, which are never resolved, itself. Deliveries follow no redirects.
//! An operator's own subscribers (`--webhook-url`) are trusted as configured.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Which callback hosts a client may name although they are internal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallbackPolicy {
    allowed: HashSet<String>,
}

/// Why a callback URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallbackRefusal {
    /// The host is, or resolves to, an address inside the server's network.
    #[error(
        "its host {host} is {addr}, an internal address ({kind}); an operator can allow the \
         host with --allow-callback-host"
    )]
    Internal {
        /// The URL's host.
        host: String,
        /// The refused address.
        addr: IpAddr,
        /// What kind of address it is.
        kind: &'static str,
    },
    /// The host has no address.
    #[error("its host {host} does not resolve: {reason}")]
    Unresolved {
        /// The URL's host.
        host: String,
        /// What the resolver said.
        reason: String,
    },
    /// The URL has no host.
    #[error("it has no host")]
    NoHost,
}

impl CallbackPolicy {
    /// A policy that allows no internal host.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allows `host` (a name or a literal address, compared without case) even when it is
    /// internal.
    pub fn allow(mut self, host: &str) -> Self {
        self.allowed.insert(normalise(host));
        self
    }

    /// A policy allowing each of `hosts`.
    pub fn allowing<I, S>(hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        hosts
            .into_iter()
            .fold(Self::new(), |policy, h| policy.allow(h.as_ref()))
    }

    /// Whether the operator allowed `host`.
    pub fn allows(&self, host: &str) -> bool {
        !self.allowed.is_empty() && self.allowed.contains(&normalise(host))
    }

    /// Checks `url`'s host: allowed by the operator, or every address it resolves to is
    /// public.
    pub async fn check(&self, url: &reqwest::Url) -> Result<(), CallbackRefusal> {
        let host = url.host_str().ok_or(CallbackRefusal::NoHost)?;
        if self.allows(host) {
            return Ok(());
        }
        if let Some(ip) = literal(url) {
            return refuse_internal(host, ip);
        }
        let port = url.port_or_known_default().unwrap_or(80);
        let addrs = resolve(host, port).await?;
        addrs
            .iter()
            .try_for_each(|addr| refuse_internal(host, addr.ip()))
    }

    /// Checks a literal address in `url` (names are checked by [`GuardedResolver`] when the
    /// client resolves them).
    pub(crate) fn check_literal(&self, url: &reqwest::Url) -> Result<(), CallbackRefusal> {
        match (url.host_str(), literal(url)) {
            (Some(host), Some(ip)) if !self.allows(host) => refuse_internal(host, ip),
            _ => Ok(()),
        }
    }
}

/// A host name as compared: lower case, without brackets or a trailing dot.
fn normalise(host: &str) -> String {
    host.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// The URL's host as an address, when it is one.
fn literal(url: &reqwest::Url) -> Option<IpAddr> {
    // The URL parser has already turned every IPv4 spelling (`0x7f.1`, `2130706433`) into
    // dotted form and bracketed IPv6.
    let host = url.host_str()?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

fn refuse_internal(host: &str, ip: IpAddr) -> Result<(), CallbackRefusal> {
    match internal_kind(ip) {
        Some(kind) => Err(CallbackRefusal::Internal {
            host: host.to_owned(),
            addr: ip,
            kind,
        }),
        None => Ok(()),
    }
}

async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, CallbackRefusal> {
    let unresolved = |reason: String| CallbackRefusal::Unresolved {
        host: host.to_owned(),
        reason,
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| unresolved(e.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(unresolved("no address".to_owned()));
    }
    Ok(addrs)
}

/// What kind of internal address `ip` is, or `None` for a public one. IPv4 addresses written
/// as IPv6 (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`) are
/// judged by the IPv4 address they carry.
pub fn internal_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => internal_v4(v4),
            None => internal_v6(v6),
        },
    }
}

fn internal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(if ip.is_unspecified() || a == 0 {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_private() {
        "private"
    } else if ip.is_link_local() {
        "link-local"
    } else if a == 100 && (64..128).contains(&b) {
        "shared address space"
    } else if ip.is_broadcast() || ip.is_multicast() || a >= 240 {
        "broadcast, multicast or reserved"
    } else if a == 192 && b == 0 && ip.octets()[2] == 0 {
        "IETF protocol assignments"
    } else if (a == 198 && (b == 18 || b == 19)) || ip.is_documentation() {
        "benchmarking or documentation"
    } else {
        return None;
    })
}

fn internal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    Some(if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if first & 0xfe00 == 0xfc00 {
        "unique local (private)"
    } else if first & 0xffc0 == 0xfe80 {
        "link-local"
    } else if first & 0xffc0 == 0xfec0 {
        "site-local"
    } else if ip.is_multicast() {
        "multicast"
    } else if first == 0x2001 && ip.segments()[1] == 0x0db8 {
        "documentation"
    } else {
        return None;
    })
}

/// The IPv4 address an IPv6 address carries, for the forms that route to IPv4 hosts.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    // IPv4-compatible (deprecated, still routed by some stacks), and the NAT64 prefix.
    let compatible = s[..6].iter().all(|&x| x == 0) && !ip.is_loopback() && !ip.is_unspecified();
    let nat64 = s[0] == 0x64 && s[1] == 0xff9b && s[2..6].iter().all(|&x| x == 0);
    (compatible || nat64).then_some(tail)
}

/// The resolver of the client that delivers callbacks: it resolves as the system does and
/// refuses a name with an internal address among its answers, unless the name is allowed.
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver {
    policy: Arc<CallbackPolicy>,
}

impl GuardedResolver {
    pub(crate) fn new(policy: Arc<CallbackPolicy>) -> Self {
        Self { policy }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str();
            // The port is the connector's to choose; it replaces this one.
            let addrs = resolve(host, 0).await?;
            if !policy.allows(host) {
                for addr in &addrs {
                    refuse_internal(host, addr.ip())?;
                }
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn internal_addresses_are_recognised_in_every_form() {
        for (addr, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("100.64.0.1", "shared address space"),
            ("255.255.255.255", "broadcast, multicast or reserved"),
            ("224.0.0.1", "broadcast, multicast or reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00::1", "unique local (private)"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
        ] {
            assert_eq!(internal_kind(ip(addr)), Some(kind), "{addr}");
        }
        for public in ["93.184.216.34", "8.8.8.8", "172.32.0.1", "2606:4700::1111"] {
            assert_eq!(internal_kind(ip(public)), None, "{public}");
        }
    }

    #[tokio::test]
    async fn literal_names_and_allowed_hosts() {
        let url = |s: &str| reqwest::Url::parse(s).expect("a URL");
        let none = CallbackPolicy::new();
        assert!(matches!(
            none.check(&url("http://127.0.0.1:9/x")).await,
            Err(CallbackRefusal::Internal {
                kind: "loopback",
                ..
            })
        ));
        assert!(none.check(&url("http://[::ffff:7f00:1]/x")).await.is_err());
        // A name that resolves to loopback is refused as its address would be.
        assert!(matches!(
            none.check(&url("http://localhost:9/x")).await,
            Err(CallbackRefusal::Internal { .. })
        ));
        assert!(matches!(
            none.check(&url("http://no-such-host.invalid/x")).await,
            Err(CallbackRefusal::Unresolved { .. })
        ));
        assert!(none.check(&url("http://93.184.216.34/x")).await.is_ok());
        let allowed = CallbackPolicy::allowing(["LocalHost.", "127.0.0.1", "[::1]"]);
        assert!(allowed.check(&url("http://localhost:9/x")).await.is_ok());
        assert!(allowed.check(&url("http://127.0.0.1:9/x")).await.is_ok());
        assert!(allowed.check(&url("http://[::1]:9/x")).await.is_ok());
        assert!(allowed.check(&url("http://10.0.0.1/x")).await.is_err());
        assert!(allowed.check_literal(&url("http://127.0.0.1/x")).is_ok());
        assert!(none.check_literal(&url("http://127.0.0.1/x")).is_err());
        assert!(none.check_literal(&url("http://localhost/x")).is_ok());
    }

    #[tokio::test]
    async fn the_resolver_refuses_internal_answers_unless_allowed() {
        let refuse = GuardedResolver::new(Arc::new(CallbackPolicy::new()));
        let name: Name = "localhost".parse().expect("a name");
        assert!(refuse.resolve(name).await.is_err());
        let allow = GuardedResolver::new(Arc::new(CallbackPolicy::new().allow("localhost")));
        let name: Name = "localhost".parse().expect("a name");
        let addrs: Vec<_> = allow.resolve(name).await.expect("allowed").collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
