package learn

// CommitCase is a row of the table that checks Commit and its twin, the
// store's script, on the same instants.
type CommitCase struct {
	Name    string
	Stored  State
	P       Proposal
	Now     int64
	Want    State
	Applied bool
}

// CommitCases returns the table on which Commit and the store's script
// (redisstore's TestLearnScript) must agree. Instants are Unix ms.
func CommitCases() []CommitCase {
	const at = 1_900_000_000_000
	cut := State{Level: 700_000, Target: 980_000, At: at, Cuts: 1}
	return []CommitCase{
		{"the first cut", State{}, Proposal{BaseAt: 0, Admitted: at - 5, Guard: 1000, Level: 700_000, Target: 980_000}, at, cut, true},
		{"a second process, from the state before the first cut", cut, Proposal{BaseAt: 0, Admitted: at, Guard: 1000, Level: 700_000, Target: 980_000}, at + 3, cut, false},
		{"a request admitted within the guard of the cut", cut, Proposal{BaseAt: at, Admitted: at + 999, Guard: 1000, Level: 490_000, Target: 686_000}, at + 1500, cut, false},
		{"one admitted at the guard's end", cut, Proposal{BaseAt: at, Admitted: at + 1000, Guard: 1000, Level: 490_000, Target: 686_000}, at + 1500,
			State{Level: 490_000, Target: 686_000, At: at + 1500, Cuts: 2}, true},
		{"a guard of a minute", cut, Proposal{BaseAt: at, Admitted: at + 30_000, Guard: 60_000, Level: 490_000, Target: 686_000}, at + 40_000, cut, false},
		{"a proposal from a state that is not the stored one", cut, Proposal{BaseAt: at - 7, Admitted: at + 5000, Guard: 1000, Level: 10_000, Target: 10_000}, at + 6000, cut, false},
		{"a request admitted before the first cut, when none was stored", State{}, Proposal{BaseAt: 0, Admitted: 0, Guard: 1000, Level: 350_000, Target: 490_000}, at,
			State{Level: 350_000, Target: 490_000, At: at, Cuts: 1}, true},
	}
}
