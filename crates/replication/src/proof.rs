//! Proofs that a peer holds a shared secret, without sending it (docs/cluster.md, "The
//! cluster secret"): a challenge and response both ways, HMAC-SHA256 over both sides'
//! fresh nonces.
//!
//! The side that connects sends a nonce; the side that accepts answers with its own nonce
//! and its proof; the side that connects checks it, and only then sends its own proof. A
//! stranger listening on a port (a member's, while that member is down) so learns nothing
//! it could show anyone: it cannot prove itself, so it is never sent a proof, and a proof
//! covers both nonces, the purpose, the side that made it and both sides' names, so none
//! is taken again on another connection, from the other side, for another purpose or for
//! another node (a stranger passing a connection on to another member gets that member's
//! proof, which names that member). What the exchange does not do: keep someone on the
//! path from taking over a connection once it is taken (TLS does), or a weak secret from
//! being guessed offline from an acceptor's proof (a secret is at least 16 bytes, and
//! `openssl rand` makes one).
//!
//! Pure: no I/O, so each step is tested without sockets; the nonces come from the
//! operating system's generator (`nonce`).

use crate::protocol::Secret;
use ring::hmac;

/// A nonce's bytes: fresh on each side of each connection.
pub const NONCE_BYTES: usize = 32;
/// A proof's bytes (HMAC-SHA256).
pub const PROOF_BYTES: usize = 32;

pub type Nonce = [u8; NONCE_BYTES];
pub type Proof = [u8; PROOF_BYTES];

/// Which side of a connection a proof is from: the same secret, nonces and names give
/// each side another proof, so neither side's proof is the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Connects,
    Accepts,
}

/// What a proof covers besides the secret: what the connection is for, who each side
/// says it is, and both nonces.
#[derive(Clone, Copy, Debug)]
pub struct Transcript<'a> {
    /// The protocol and its version, e.g. "ditto control hello 1".
    pub purpose: &'a str,
    /// The name the side that connects gave (a node's id, an operator's 0).
    pub connects: &'a [u8],
    /// The name the side that accepts gave.
    pub accepts: &'a [u8],
    pub connects_nonce: &'a Nonce,
    pub accepts_nonce: &'a Nonce,
}

impl Transcript<'_> {
    /// The bytes a proof signs: every field length-prefixed (no two transcripts read the
    /// same), the side first.
    fn message(&self, side: Side) -> Vec<u8> {
        let mut m = Vec::with_capacity(128);
        m.push(match side {
            Side::Connects => b'C',
            Side::Accepts => b'A',
        });
        for part in [self.purpose.as_bytes(), self.connects, self.accepts] {
            m.extend_from_slice(&(part.len() as u32).to_le_bytes());
            m.extend_from_slice(part);
        }
        m.extend_from_slice(self.connects_nonce);
        m.extend_from_slice(self.accepts_nonce);
        m
    }
}

/// A fresh nonce from the operating system's generator.
pub fn nonce() -> Nonce {
    let mut n = [0u8; NONCE_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut n)
        .expect("the operating system's random generator failed");
    n
}

/// `side`'s proof that it holds `secret`, for the connection `t` describes.
pub fn prove(secret: &Secret, side: Side, t: &Transcript) -> Proof {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.0.as_bytes());
    let tag = hmac::sign(&key, &t.message(side));
    tag.as_ref().try_into().expect("HMAC-SHA256 is 32 bytes")
}

/// Whether `given` is `side`'s proof under any of `secrets` (a node takes several while
/// its secret is rotated): each compared in constant time, all of them every time, so the
/// time taken says nothing of which matched or how much of a guess was right.
pub fn verify<'s>(secrets: impl IntoIterator<Item = &'s Secret>, side: Side, t: &Transcript, given: &[u8]) -> bool {
    let message = t.message(side);
    secrets.into_iter().fold(false, |ok, s| {
        let key = hmac::Key::new(hmac::HMAC_SHA256, s.0.as_bytes());
        hmac::verify(&key, &message, given).is_ok() | ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_is_taken_only_for_its_secret_side_names_nonces_and_purpose() {
        let s = Secret("the-cluster-secret-1".into());
        let (nc, na) = (nonce(), nonce());
        assert_ne!(nc, na, "two nonces from the generator");
        let t = Transcript {
            purpose: "ditto control hello 1",
            connects: b"2",
            accepts: b"3",
            connects_nonce: &nc,
            accepts_nonce: &na,
        };
        let p = prove(&s, Side::Accepts, &t);
        assert!(verify([&s], Side::Accepts, &t, &p));
        // Another secret, or the secret among others (a rotation's).
        let other = Secret("the-cluster-secret-2".into());
        assert!(!verify([&other], Side::Accepts, &t, &p));
        assert!(verify([&other, &s], Side::Accepts, &t, &p));
        assert!(!verify(std::iter::empty(), Side::Accepts, &t, &p));
        // The other side's, or for anything else the transcript names.
        assert!(!verify([&s], Side::Connects, &t, &p));
        let n3 = nonce();
        for changed in [
            Transcript { purpose: "ditto replication hello 1", ..t },
            Transcript { connects: b"4", ..t },
            Transcript { accepts: b"4", ..t },
            Transcript { connects_nonce: &n3, ..t },
            Transcript { accepts_nonce: &n3, ..t },
            // (Names moved across the boundary between fields read differently.)
            Transcript { connects: b"23", accepts: b"", ..t },
        ] {
            assert!(!verify([&s], Side::Accepts, &changed, &p), "{changed:?}");
            assert_ne!(prove(&s, Side::Accepts, &changed), p);
        }
        // A proof cut short, grown or with one bit changed.
        assert!(!verify([&s], Side::Accepts, &t, &p[..31]));
        assert!(!verify([&s], Side::Accepts, &t, &[&p[..], &[0]].concat()));
        for i in 0..PROOF_BYTES * 8 {
            let mut q = p;
            q[i / 8] ^= 1 << (i % 8);
            assert!(!verify([&s], Side::Accepts, &t, &q), "bit {i}");
        }
        // The same inputs prove the same (both sides compute it).
        assert_eq!(prove(&s, Side::Accepts, &t), p);
    }

    /// The proof's layout, pinned: HMAC-SHA256 keyed by the secret's bytes, over the side
    /// ('A' or 'C'), the purpose and both names (each after its length, u32 little-endian),
    /// then both nonces. These figures were made by Python's `hmac` from that description,
    /// not by this code: a peer written elsewhere computes the same, and a change of layout
    /// (which older nodes would refuse) fails here first.
    #[test]
    fn the_proof_is_hmac_sha256_over_the_layout_described() {
        let s = Secret("the-cluster-secret-1".into());
        let t = Transcript {
            purpose: "ditto control hello 1",
            connects: b"2",
            accepts: b"3",
            connects_nonce: &[1; NONCE_BYTES],
            accepts_nonce: &[2; NONCE_BYTES],
        };
        let hex = |p: Proof| p.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(prove(&s, Side::Accepts, &t)),
            "eb8a57f1197c6b98354650c245d915c1170194be65d38d78e725ef100982dd5f"
        );
        assert_eq!(
            hex(prove(&s, Side::Connects, &t)),
            "176d4ec9d5bbbf38e824f2269617abc459f94942e44b5894feddc7baf11831a3"
        );
    }
}
