//! Which kind of lock a call or a hold is: one enum for the whole crate. The public views of
//! it are [`LockKind`](crate::LockKind), what an operator's listing shows, and
//! [`LeaseKind`](crate::LeaseKind), what a lost lease says.

/// Which kind of lock a call or a hold is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A [`Mutex`](crate::Mutex) (also on a quorum, and each name of a set).
    Mutex,
    /// A call of a [`MultiMutex`](crate::MultiMutex), counted as one acquire; the holds it
    /// makes are [`Kind::Mutex`] holds, one per name.
    MultiMutex,
    /// A [`FairMutex`](crate::FairMutex)'s lock.
    FairMutex,
    /// A waiter's place in a [`FairMutex`](crate::FairMutex)'s queue (its heartbeat): not a
    /// lease the application holds, so it is neither counted nor reported as one.
    FairPlace,
    /// A reader of an [`RwLock`](crate::RwLock).
    Read,
    /// The writer of an [`RwLock`](crate::RwLock).
    Write,
    /// The permits of one [`Semaphore`](crate::Semaphore) acquisition.
    Permits,
    /// The leadership of an [`Election`](crate::Election): a Mutex on the election's keys.
    Election,
}

impl Kind {
    /// The `type` label of the stats and metrics of this kind's calls and holds.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::MultiMutex => "multi_mutex",
            Kind::FairMutex | Kind::FairPlace => "fair_mutex",
            Kind::Read | Kind::Write => "rw_lock",
            Kind::Permits => "semaphore",
            Kind::Election => "election",
        }
    }

    /// Whether a hold of this kind is a lease the application holds (not a waiter's place).
    pub(crate) fn is_lease(self) -> bool {
        self != Kind::FairPlace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_of_a_read_write_lock_are_counted_as_one_type() {
        assert_eq!(Kind::Read.label(), Kind::Write.label());
        assert!(!Kind::FairPlace.is_lease());
        assert!(Kind::FairMutex.is_lease());
    }
}
