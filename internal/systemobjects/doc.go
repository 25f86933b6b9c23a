// Package systemobjects holds kelp's own API objects, applied on every start.
//
// The server applies them with server-side apply under the field manager
// "kelp", forcing ownership of the fields it sets, so that a rule a newer
// kelp adds reaches a cluster an older one made, and an edit to those
// fields is undone at the next start. Fields kelp does not set (a label a
// user adds) are left alone.
package systemobjects
