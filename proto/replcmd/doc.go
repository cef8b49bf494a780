// Package replcmd is the command language of a safekeeper connection in
// query mode: PostgreSQL 15's replication commands (after repl_gram.y and
// repl_scanner.l) and this server's own, parsed from the text of one simple
// Query into a Command value.
//
//	IDENTIFY_SYSTEM
//	SHOW name                                   (name or "quoted"; a.b allowed)
//	TIMELINE_HISTORY n
//	READ_REPLICATION_SLOT slot
//	CREATE_REPLICATION_SLOT slot [TEMPORARY] PHYSICAL [RESERVE_WAL]
//	CREATE_REPLICATION_SLOT slot [TEMPORARY] PHYSICAL (RESERVE_WAL [bool] [, ...])
//	DROP_REPLICATION_SLOT slot [WAIT]
//	START_REPLICATION [SLOT slot] [PHYSICAL] X/X [TIMELINE n] [(term 'N')]
//	TIMELINE_STATUS                             (ours)
//	START_WAL_PUSH [(allow_timeline_creation [bool], sync_replication_slots [bool])]  (ours; the proposer's stream)
//
// Keywords are case-sensitive upper case, as in PostgreSQL; START_WAL_PUSH is
// also accepted in any case (proposers have always been served that way).
// Slot names are identifiers (folded to lower case) or "double-quoted"
// (kept as written, "" is a quote). A trailing ';' is allowed. Text whose
// first word is not a command keyword is SQL (a SQL command, not an error):
// the server refuses it, as a walsender does. An empty query is Empty.
//
// The (term 'N') option is ours: a reader naming the term of the proposer it
// follows may read up to flush_lsn (not only commit_lsn) while this
// safekeeper's voted term is still N. The value may also be an unquoted
// number; the option name is case-insensitive.
//
// What it owns: the syntax of the commands and the checks PostgreSQL's
// grammar makes on their arguments (a TLI of 0, an unknown option, a
// malformed LSN), and the refusal of what a safekeeper never runs
// (BASE_BACKUP, logical replication). A refused query is an *Error whose
// Kind is ErrSyntax or ErrUnsupported, with the message the client is to
// see; the server gives it its SQLSTATE (42601 syntax_error, 0A000
// feature_not_supported). Whether a slot name is valid (proto.CheckSlotName),
// whether the timeline holds a start point, whether a term is current: those
// are decided by whoever runs the command.
//
// Lifecycle: none. Parse is a pure function of its input, safe for
// concurrent use; a Command is a plain value.
//
// Why the boundary sits here: the command language is text from any client
// on the network, so it is a pure function that is fuzzed (FuzzReplGrammar)
// and tested without a socket, and it imports nothing that does IO, nor the
// wire transport (proto/pgwire; a test checks the imports). The server
// executes the commands; the transport carries the query text and the
// answers.
package replcmd
