package pgwire

import (
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgproto3/v2"
)

// Type OIDs and lengths (pg_type.typlen) of the column types replication
// commands return.
const (
	TextOID  uint32 = 25
	TextSize int16  = -1
	Int4OID  uint32 = 23
	Int4Size int16  = 4
	Int8OID  uint32 = 20
	Int8Size int16  = 8
)

// Column describes one result column. Every column is sent in text format
// (0) with table OID 0 and attribute number 0, as the walsender does.
type Column struct {
	Name     string
	TypeOID  uint32
	TypeSize int16 // typlen: -1 for variable length
	TypeMod  int32 // -1 for "none"; TIMELINE_HISTORY sends 0
}

// TextColumn returns a text column (OID 25, typlen -1, typmod -1).
func TextColumn(name string) Column { return Column{name, TextOID, TextSize, -1} }

// Int4Column returns an int4 column (OID 23, typlen 4, typmod -1).
func Int4Column(name string) Column { return Column{name, Int4OID, Int4Size, -1} }

// Int8Column returns an int8 column (OID 20, typlen 8, typmod -1).
func Int8Column(name string) Column { return Column{name, Int8OID, Int8Size, -1} }

// ReadQuery returns the text of the next simple Query ('Q'). It must be
// called only from the connection's reader goroutine, and not while the
// connection is in COPY mode. It handles by itself, and keeps reading:
//
//   - Parse, Bind, Describe, Execute, Close (the extended query protocol):
//     ErrorResponse 08P01 "extended query protocol not supported in a
//     replication connection", then, like PostgreSQL, every message up to the
//     next Sync is discarded and that Sync is answered with ReadyForQuery. So
//     a client's Parse/Describe/Sync sees exactly one error and one
//     ReadyForQuery, and the connection goes on.
//   - FunctionCall: ErrorResponse 08P01 and ReadyForQuery.
//   - Sync: ReadyForQuery. Flush: flushes. CopyData, CopyDone, CopyFail
//     outside COPY: ignored (as PostgreSQL does).
//
// It returns io.EOF when the client sends Terminate or closes the connection
// at a message boundary. An *Error with severity FATAL (and SQLSTATE 08P01)
// means the stream cannot go on: send it with SendError, Flush and Close;
// that is the answer to a message type PostgreSQL does not take ("invalid
// frontend message type 63"), whose framing cannot be trusted. An *Error
// with severity ERROR (unset) is a Query read whole but malformed, with
// PostgreSQL's text: "invalid string in message" (no NUL terminator) or
// "invalid message format" (a NUL inside); the connection is intact, so
// answer it, as PostgreSQL does, with SendError and SendReadyForQuery, and
// read on. An empty query string is returned as is; answer it with
// SendEmptyQueryResponse and SendReadyForQuery.
func (c *Conn) ReadQuery() (string, error) {
	ignoreTillSync := false
	for {
		msg, err := c.receive()
		if err != nil {
			var e *Error
			if ignoreTillSync && errors.As(err, &e) && e.Severity == "" {
				continue // a malformed Query, read whole: discarded like the rest
			}
			return "", err
		}
		switch m := msg.(type) {
		case *pgproto3.Query:
			if !ignoreTillSync {
				return m.String, nil
			}
		case *pgproto3.Terminate:
			c.readErr = io.EOF
			return "", io.EOF
		case *pgproto3.Parse, *pgproto3.Bind, *pgproto3.Describe, *pgproto3.Execute, *pgproto3.Close:
			if !ignoreTillSync {
				ignoreTillSync = true
				err := c.SendError(Errorf(ProtocolViolation, "extended query protocol not supported in a replication connection"))
				if err == nil {
					err = c.Flush()
				}
				if err != nil {
					return "", err
				}
			}
		case *pgproto3.FunctionCall:
			if !ignoreTillSync {
				if err := c.SendError(Errorf(ProtocolViolation, "fastpath function calls not supported in a replication connection")); err != nil {
					return "", err
				}
				if err := c.SendReadyForQuery(); err != nil {
					return "", err
				}
			}
		case *pgproto3.Sync:
			ignoreTillSync = false
			if err := c.SendReadyForQuery(); err != nil {
				return "", err
			}
		case *pgproto3.Flush:
			if !ignoreTillSync {
				if err := c.Flush(); err != nil {
					return "", err
				}
			}
		case *pgproto3.CopyData, *pgproto3.CopyDone, *pgproto3.CopyFail:
			// PostgreSQL ignores these outside COPY: they may trail a COPY
			// that the server ended with an error.
		default:
			err := errFrontendType(c.frames.typ)
			c.readErr = err
			return "", err
		}
	}
}

// SendRowDescription buffers a RowDescription for cols.
func (c *Conn) SendRowDescription(cols []Column) error {
	return c.send(rowDescription(cols))
}

func rowDescription(cols []Column) *pgproto3.RowDescription {
	rd := &pgproto3.RowDescription{Fields: make([]pgproto3.FieldDescription, len(cols))}
	for i, col := range cols {
		rd.Fields[i] = pgproto3.FieldDescription{
			Name:                 []byte(cstring(col.Name)),
			TableOID:             0,
			TableAttributeNumber: 0,
			DataTypeOID:          col.TypeOID,
			DataTypeSize:         col.TypeSize,
			TypeModifier:         col.TypeMod,
			Format:               pgproto3.TextFormat,
		}
	}
	return rd
}

// SendDataRow buffers one DataRow; a nil value is SQL NULL.
func (c *Conn) SendDataRow(values [][]byte) error {
	return c.send(&pgproto3.DataRow{Values: values})
}

// SendRows buffers a whole result set: RowDescription, one DataRow per row
// (text values; nil is NULL) and CommandComplete(tag). Every row must have
// len(cols) values. The messages are contiguous in the output even when other
// goroutines send concurrently.
func (c *Conn) SendRows(cols []Column, rows [][][]byte, tag string) error {
	msgs := make([]pgproto3.BackendMessage, 0, len(rows)+2)
	msgs = append(msgs, rowDescription(cols))
	for i, r := range rows {
		if len(r) != len(cols) {
			return fmt.Errorf("pgwire: row %d has %d values for %d columns", i, len(r), len(cols))
		}
		msgs = append(msgs, &pgproto3.DataRow{Values: r})
	}
	msgs = append(msgs, &pgproto3.CommandComplete{CommandTag: []byte(cstring(tag))})
	return c.send(msgs...)
}

// SendCommandComplete buffers CommandComplete with tag (e.g.
// "IDENTIFY_SYSTEM", "START_STREAMING", "COPY 0").
func (c *Conn) SendCommandComplete(tag string) error {
	return c.send(&pgproto3.CommandComplete{CommandTag: []byte(cstring(tag))})
}

// SendEmptyQueryResponse buffers EmptyQueryResponse, the answer to an empty
// query string.
func (c *Conn) SendEmptyQueryResponse() error {
	return c.send(&pgproto3.EmptyQueryResponse{})
}

// SendParameterStatus buffers a ParameterStatus (allowed at any time).
func (c *Conn) SendParameterStatus(name, value string) error {
	return c.send(&pgproto3.ParameterStatus{Name: cstring(name), Value: cstring(value)})
}

// SendReadyForQuery sends ReadyForQuery (idle) and flushes: it ends every
// query cycle, and the client waits for it.
func (c *Conn) SendReadyForQuery() error {
	if err := c.send(&pgproto3.ReadyForQuery{TxStatus: 'I'}); err != nil {
		return err
	}
	return c.Flush()
}

// SendError buffers an ErrorResponse for err: the first *Error in err's chain
// as is (severity ERROR if unset), any other error as InternalError (XX000)
// with err's text. The caller decides what follows: SendReadyForQuery to go
// on, or Flush and Close.
func (c *Conn) SendError(err error) error {
	return c.send(errorResponse(asError(err), SeverityError))
}

// SendNotice buffers a NoticeResponse built from n; its severity defaults to
// NOTICE and its code to 00000.
func (c *Conn) SendNotice(n *Error) error {
	if n == nil {
		return errors.New("pgwire: SendNotice(nil)")
	}
	e := *n
	if e.Severity == "" {
		e.Severity = SeverityNotice
	}
	if e.Code == "" {
		e.Code = SuccessfulCompletion
	}
	return c.send((*pgproto3.NoticeResponse)(errorResponse(&e, SeverityNotice)))
}

// errorResponse converts e, with severity def if e has none.
func errorResponse(e *Error, def string) *pgproto3.ErrorResponse {
	sev := e.Severity
	if sev == "" {
		sev = def
	}
	code := e.Code
	if code == "" {
		code = InternalError
	}
	return &pgproto3.ErrorResponse{
		Severity:            cstring(sev),
		SeverityUnlocalized: cstring(sev),
		Code:                cstring(code),
		Message:             cstring(ClientText(e.Message)),
		Detail:              cstring(ClientText(e.Detail)),
		Hint:                cstring(ClientText(e.Hint)),
	}
}
