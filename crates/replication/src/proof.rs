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
//! being guessed offline from an acceptor's proof, which anyone who reaches the port is
//! given. Against that guessing the proofs are keyed not by the secret but by the secret
//! stretched (`stretched`: PBKDF2-HMAC-SHA256, `STRETCH_ROUNDS` rounds, salted by the
//! purpose and a salt the side that accepts names), as SCRAM keys its proofs: each guess
//! costs that many HMACs. A secret of 16 random bytes (`openssl rand`) is out of reach
//! however; a word from a dictionary is not (a review's find, 2026-12-06: `requirepass`
//! has no bound on its strength, and a replication port gives a proof of it).
//!
//! Pure: no I/O, so each step is tested without sockets; the nonces come from the
//! operating system's generator (`nonce`). A stretched key is kept, by a digest of what
//! made it, for the next connection (`stretched`).

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
    /// The salt of the secret's stretch, named by the side that accepts (a primary's
    /// database id): the same for every connection to it, so the stretch is made once.
    pub salt: &'a [u8],
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

/// Rounds of the secret's stretch: about 7 ms on a core of the 2-core VM (OpenSSL's
/// PBKDF2 through Python's hashlib: 6.6 ms; made once per secret, purpose and salt in a
/// process), and as many HMACs per guess of a proof's secret.
pub const STRETCH_ROUNDS: u32 = 20_000;

/// At most this many stretched keys are kept (a node's secrets while rotated, a backup's
/// primaries' salts).
const STRETCHED_KEPT: usize = 32;

/// The key proofs under `secret` are made with, for `purpose` and `salt`: PBKDF2-HMAC-SHA256
/// of the secret, salted by `purpose`, a zero byte and `salt`, over `STRETCH_ROUNDS`
/// rounds. Kept for the next connection (the last `STRETCHED_KEPT`, by a SHA-256 digest of
/// what made each, not the secret).
pub fn stretched(secret: &Secret, purpose: &str, salt: &[u8]) -> hmac::Key {
    use std::sync::Mutex;
    static KEPT: Mutex<Vec<([u8; 32], hmac::Key)>> = Mutex::new(Vec::new());
    let mut d = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [secret.0.as_bytes(), purpose.as_bytes(), salt] {
        d.update(&(part.len() as u64).to_le_bytes());
        d.update(part);
    }
    let id: [u8; 32] = d.finish().as_ref().try_into().expect("SHA-256 is 32 bytes");
    if let Some((_, k)) = KEPT.lock().unwrap().iter().find(|(i, _)| *i == id) {
        return k.clone();
    }
    let mut stretched = [0u8; 32];
    let salted = [purpose.as_bytes(), &[0], salt].concat();
    let rounds = std::num::NonZeroU32::new(STRETCH_ROUNDS).expect("rounds");
    ring::pbkdf2::derive(ring::pbkdf2::PBKDF2_HMAC_SHA256, rounds, &salted, secret.0.as_bytes(), &mut stretched);
    let key = hmac::Key::new(hmac::HMAC_SHA256, &stretched);
    let mut kept = KEPT.lock().unwrap();
    // (Another connection may have made the same meanwhile: kept once.)
    if !kept.iter().any(|(i, _)| *i == id) {
        if kept.len() >= STRETCHED_KEPT {
            kept.remove(0);
        }
        kept.push((id, key.clone()));
    }
    key
}

/// `side`'s proof that it holds `secret`, for the connection `t` describes.
pub fn prove(secret: &Secret, side: Side, t: &Transcript) -> Proof {
    let tag = hmac::sign(&stretched(secret, t.purpose, t.salt), &t.message(side));
    tag.as_ref().try_into().expect("HMAC-SHA256 is 32 bytes")
}

/// Whether `given` is `side`'s proof under any of `secrets` (a node takes several while
/// its secret is rotated): each compared in constant time, all of them every time, so the
/// time taken says nothing of which matched or how much of a guess was right.
pub fn verify<'s>(secrets: impl IntoIterator<Item = &'s Secret>, side: Side, t: &Transcript, given: &[u8]) -> bool {
    matching(secrets, side, t, given).is_some()
}

/// `verify`, and which of `secrets` the proof was made with (the first that takes it):
/// the side that connects proves with that one, which the other side holds, so that
/// either side may show either secret of a rotation.
pub fn matching<'s>(
    secrets: impl IntoIterator<Item = &'s Secret>,
    side: Side,
    t: &Transcript,
    given: &[u8],
) -> Option<&'s Secret> {
    let message = t.message(side);
    secrets.into_iter().fold(None, |found, s| {
        let ok = hmac::verify(&stretched(s, t.purpose, t.salt), &message, given).is_ok();
        found.or(ok.then_some(s))
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
            salt: b"",
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
            Transcript { salt: b"another", ..t },
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

    /// The proof's layout, pinned: HMAC-SHA256 keyed by the secret stretched
    /// (PBKDF2-HMAC-SHA256 of the secret, salted by the purpose, a zero byte and the salt,
    /// `STRETCH_ROUNDS` rounds, 32 bytes), over the side ('A' or 'C'), the purpose and both
    /// names (each after its length, u32 little-endian), then both nonces. These figures were made by Python's `hmac` from that description,
    /// not by this code: a peer written elsewhere computes the same, and a change of layout
    /// (which older nodes would refuse) fails here first.
    #[test]
    fn the_proof_is_hmac_sha256_over_the_layout_described() {
        let s = Secret("the-cluster-secret-1".into());
        let t = Transcript {
            purpose: "ditto control hello 1",
            salt: b"s",
            connects: b"2",
            accepts: b"3",
            connects_nonce: &[1; NONCE_BYTES],
            accepts_nonce: &[2; NONCE_BYTES],
        };
        let hex = |p: Proof| p.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(prove(&s, Side::Accepts, &t)),
            "b8c381b58e04790edc9a3056597a0a4258bb40130a59c369c929db1c1d549036"
        );
        assert_eq!(
            hex(prove(&s, Side::Connects, &t)),
            "55937b2a896326ee3cee1ff9cd3434a274f95f0778a3113fca221baba713385f"
        );
    }
}
