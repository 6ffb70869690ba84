use std::{
    collections::HashMap,
    marker::PhantomData,
    sync::{Arc, Mutex},
};

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, RwLock};
use xtoken_communication::{CommunicationChannel, Message, Protocol, ProtocolClient};

use crate::{NodeId, global::shared::GlobalCollectiveError, node::base::NodeState};

/// Handles the status of sync requests from other nodes
pub(crate) struct SyncService<P: Protocol> {
    /// Current node's state, shared with the thread that does aggregations
    node_state: Arc<RwLock<Option<NodeState>>>,
    /// The peers that have requested to sync with us, per operation (xtoken patch: upstream kept
    /// one list whose `clear()` emptied a copy, so a session's second barrier never completed).
    syncing_peers: Mutex<HashMap<u64, Vec<NodeId>>>,
    /// Notification on each incoming sync request
    sync_notif: Notify,

    _p: PhantomData<P>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SyncRequest(NodeId, u64);

impl<P: Protocol> SyncService<P> {
    pub fn new(node_state: Arc<RwLock<Option<NodeState>>>) -> Self {
        Self {
            node_state,
            syncing_peers: Mutex::new(HashMap::new()),
            sync_notif: Notify::new(),
            _p: PhantomData,
        }
    }

    fn add_syncing_peer(&self, peer: NodeId, operation: u64) {
        let mut syncing_peers = self.syncing_peers.lock().unwrap();
        syncing_peers.entry(operation).or_default().push(peer);
    }

    /// Sync with all peers at the end of global operation number `operation`.
    /// xtoken patch: a peer that cannot be reached is `PeerLost` (upstream panicked).
    pub async fn sync(&self, operation: u64) -> Result<(), GlobalCollectiveError> {
        // we can't sync while we register
        let node_state = self.node_state.read().await;
        let node_state = node_state
            .as_ref()
            .expect("Trying to sync a node before having registered to the orchestrator");

        // this peer is syncing
        self.add_syncing_peer(node_state.node_id, operation);
        for (id, addr) in &node_state.nodes {
            if *id == node_state.node_id {
                continue;
            }

            let mut connection = P::Client::connect(addr.clone(), "sync")
                .await
                .ok_or(GlobalCollectiveError::PeerLost(*id))?;
            let msg = SyncRequest(node_state.node_id, operation);
            let sync_bytes = rmp_serde::to_vec(&msg).unwrap();
            connection
                .send(Message::new(sync_bytes.into()))
                .await
                .map_err(|_| GlobalCollectiveError::PeerLost(*id))?;
        }
        let mut all_node_ids = node_state.nodes.keys().cloned().collect::<Vec<_>>();
        all_node_ids.sort();
        loop {
            // xtoken patch: listen before looking, so that a request arriving in between is not
            // missed (`notify_waiters` only wakes listeners already registered).
            let mut notified = std::pin::pin!(self.sync_notif.notified());
            notified.as_mut().enable();
            {
                // compare this operation's synced peers with list of all nodes
                let mut all_synced = self.syncing_peers.lock().unwrap();
                let mut syncing_peers = all_synced.get(&operation).cloned().unwrap_or_default();
                syncing_peers.sort();

                if syncing_peers == all_node_ids {
                    // all nodes have synced
                    all_synced.remove(&operation);
                    return Ok(());
                }
            }
            // Wait for the next sync to come in
            notified.await
        }
    }

    pub async fn handle_sync_connection<C: CommunicationChannel>(&self, mut channel: C) {
        // xtoken patch: a peer that dies while it connects ends the connection; the barrier
        // names it (`PeerLost`) instead of a panic on the runtime's thread.
        let Ok(Some(msg)) = channel.recv().await else {
            return;
        };
        let Ok(msg) = rmp_serde::from_slice::<SyncRequest>(&msg.data) else {
            log::warn!("a sync request that could not be read; the connection ends");
            return;
        };

        self.add_syncing_peer(msg.0, msg.1);

        self.sync_notif.notify_waiters();
    }
}
