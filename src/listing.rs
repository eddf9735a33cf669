//! A watch's listing, taken whole.
//!
//! kube-runtime's watcher delivers a listing (at start, and the relist
//! after a 410) as `Init`, one `InitApply` per object, then `InitDone`. A
//! reflector's store shows the listing only once it is done, and an object
//! the listing lacks has gone meanwhile. So every feed of crr-proxy's that
//! follows a watch (the agent's per-Pod queue, the claimer's queue, a
//! restart run's mirror) gathers what a listing brings and acts on it whole
//! at `InitDone`: this gathering, kept in one place.

/// The items gathered from the listing under way.
#[derive(Debug)]
pub struct Listing<T> {
    gathered: Option<Vec<T>>,
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Self { gathered: None }
    }
}

impl<T> Listing<T> {
    /// A listing begins (`Init`); what an unfinished one gathered is
    /// dropped, as the watcher starts it over.
    pub fn begin(&mut self) {
        self.gathered = Some(Vec::new());
    }

    /// One item of the listing (`InitApply`).
    pub fn add(&mut self, item: T) {
        self.gathered.get_or_insert_with(Vec::new).push(item);
    }

    /// The listing is whole (`InitDone`): every item it brought, in order.
    pub fn done(&mut self) -> Vec<T> {
        self.gathered.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_given_whole_and_an_unfinished_one_is_dropped() {
        let mut listing = Listing::default();
        listing.begin();
        listing.add("a");
        listing.add("b");
        // The watch failed and lists again from the start.
        listing.begin();
        listing.add("b");
        listing.add("c");
        assert_eq!(listing.done(), ["b", "c"]);
        // Nothing under way: nothing given.
        assert!(listing.done().is_empty());
    }
}
