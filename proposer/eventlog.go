package proposer

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/safekeeper/safekeeper/proposer/session"
)

// logEvents logs what a Session decided (session.Ready.Events) as the lines an
// operator reads: names are the safekeepers' addresses, and quiet(i) says
// that safekeeper i's connection lines (greeted, vote granted, streaming)
// go at debug rather than info — a reconnect after the same failure as
// the one before (skEvent.quiet), whose link's held-back warning already
// says the safekeeper keeps failing.
func logEvents(log *slog.Logger, names []string, quiet func(i int) bool, events []session.Event) {
	ctx := context.Background()
	for _, ev := range events {
		var name string
		if ev.Safekeeper >= 0 {
			name = names[ev.Safekeeper]
		}
		switch ev.Kind {
		case session.EventGreeted:
			info := ev.Info
			log.Log(ctx, linkLevel(quiet(ev.Safekeeper)), "safekeeper greeted", "safekeeper", name, "id", info.SafekeeperID, "voted_for", info.VotedFor.String(),
				"last_log_term", info.LastLogTerm, "flush_lsn", info.FlushLSN, "commit_lsn", info.CommitLSN)
		case session.EventCampaigning:
			log.Info("campaigning", "term", ev.Ballot.Term, "uuid", ev.Ballot.UUID.String())
		case session.EventVotedForOther:
			log.Warn("safekeeper voted for another candidate of our term; it sits out this term", "safekeeper", name, "err", ev.Err)
		case session.EventVoteGranted:
			log.Log(ctx, linkLevel(quiet(ev.Safekeeper)), "vote granted", "safekeeper", name, "term", ev.Ballot.Term,
				"last_log_term", ev.Info.LastLogTerm, "flush_lsn", ev.Info.FlushLSN)
		case session.EventElected:
			e := ev.Election
			log.Info("elected", "term", e.Term, "donor", names[e.Donor], "term_start_lsn", e.TermStartLSN,
				"timeline_start_lsn", e.TimelineStartLSN, "new_timeline", e.NewTimeline, "history", fmt.Sprint(e.History))
		case session.EventCannotJoin:
			log.Error("safekeeper cannot join this term", "safekeeper", name, "err", ev.Err)
		case session.EventStreaming:
			log.Log(ctx, linkLevel(quiet(ev.Safekeeper)), "safekeeper streaming", "safekeeper", name, "start_streaming_at", ev.StartStreamingAt)
		case session.EventDropped:
			log.Error("unexpected message from safekeeper; dropping the connection", "safekeeper", name, "message", fmt.Sprintf("%T", ev.Msg))
		case session.EventNotMember:
			log.Log(ctx, linkLevel(quiet(ev.Safekeeper)), "safekeeper is not a member of the configuration; it sits out", "safekeeper", name, "err", ev.Err)
		case session.EventWrongSafekeeper:
			log.Warn("another safekeeper than the configuration names answers at the address; dropping the connection", "safekeeper", name, "err", ev.Err)
		default:
			// Every kind has its case above (TestEveryEventIsLogged); a
			// new one is logged plainly rather than stopping the proposer.
			log.Warn("session event", "kind", ev.Kind.String(), "safekeeper", name, "err", ev.Err)
		}
	}
}

// linkLevel is the level of a safekeeper's connection lines: debug when
// quiet (see logEvents), info otherwise.
func linkLevel(quiet bool) slog.Level {
	if quiet {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}
