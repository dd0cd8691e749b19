package regions

// PeerState is what the syncer knows of a peer region, as Peers reports
// it.
type PeerState struct {
	Peer string
	// Reachable is false once pushes to the peer have failed for longer
	// than Config.Hold (the peer then counts as its share).
	Reachable bool
	// Failing reports that the last push or ping failed.
	Failing bool
	// LastOK is when a push or ping to the peer last succeeded (Unix ms,
	// the local clock).
	LastOK int64
}

// Peers returns the state of every peer, by name.
func (s *Store) Peers() []PeerState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PeerState, 0, len(s.names))
	for _, name := range s.names {
		p := s.peers[name]
		out = append(out, PeerState{Peer: name, Reachable: !p.down, Failing: p.failing, LastOK: p.lastOK})
	}
	return out
}
