package bootguard

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/version"
)

var log = logrus.WithField("component", "boot-guard")

// Config is what a guard watches.
type Config struct {
	DataDir string
	// Role is "server" or "agent", for messages and the lock.
	Role    string
	Running version.Ran
	// Before is the kelp that ran the data dir last, for when no kelp
	// became ready on it under the guard; nil: none ran it.
	Before *version.Ran
	// Attempts is how many starts in a row an upgrade gets to become
	// ready before it is rolled back; 0: never rolled back.
	Attempts int
	// Binary is the running kelp's file: kelp.previous beside it is the
	// kelp a rollback returns to.
	Binary string
}

// Guard watches one start of kelp on a data dir. It holds the data dir's
// lock, which keeps a second kelp and `kelp upgrade rollback` away, until
// Close.
type Guard struct {
	cfg  Config
	path string
	// mu guards rec and ready: the apiserver reports writes (WriteWatch)
	// while the server starts.
	mu      sync.Mutex
	rec     Record
	ready   bool
	release func()
}

// ErrRolledBack is returned once the node was rolled back.
var ErrRolledBack = errors.New("the upgrade was rolled back (logged above): exiting so that the service manager starts the previous kelp")

// BeginHere is Begin for this kelp process, as role on dataDir with
// attempts: the kelp that runs is this one, in this file, and what ran
// the data dir before is what Before finds.
func BeginHere(dataDir, role string, attempts int) (*Guard, error) {
	before, err := Before(dataDir, role)
	if err != nil {
		return nil, err
	}
	binary, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this kelp's file: %w", err)
	}
	return Begin(Config{DataDir: dataDir, Role: role, Running: version.Current(), Before: before, Attempts: attempts, Binary: binary})
}

// Begin counts this start. If the upgrade it tries already had its
// starts, the last of them killed before it could roll back, it rolls
// back now and returns ErrRolledBack: the caller exits non-zero.
func Begin(cfg Config) (*Guard, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", cfg.DataDir, err)
	}
	release, err := Lock(cfg.DataDir, cfg.Role)
	if err != nil {
		return nil, markCounted(err)
	}
	g := &Guard{cfg: cfg, path: layout.BootGuard(cfg.DataDir), release: release}
	rec, err := load(g.path)
	if err != nil {
		release()
		return nil, err
	}
	next, due := rec.start(cfg.Running, cfg.Before, cfg.Attempts, time.Now())
	if err := g.set(rec, next); err != nil {
		release()
		return nil, err
	}
	up := next.Upgrade
	if up == nil {
		return g, nil
	}
	if due {
		reason := fmt.Sprintf("its last start ended before it became ready without a word (killed, or crashed), after %d starts", up.Starts)
		if err := g.rollBack(reason); err != nil {
			// Without a way back, the node can only go on trying.
			log.WithError(err).Error("The boot guard cannot roll back; starting the new kelp again")
			return g, nil
		}
		release()
		return nil, markCounted(ErrRolledBack)
	}
	log.WithFields(logrus.Fields{"from": describe(up.From), "to": describe(up.To), "start": up.Starts, "of": g.cfg.Attempts}).
		Info("Starting an upgraded kelp: it is rolled back to kelp.previous if it does not become ready within its starts")
	return g, nil
}

// set writes next in place of rec, if it differs.
func (g *Guard) set(rec, next Record) error {
	a, _ := jsonOf(rec)
	b, _ := jsonOf(next)
	g.rec = next
	if a == b {
		return nil
	}
	return next.save(g.path)
}

// Upgrade is the upgrade this start tries; nil when it is none.
func (g *Guard) Upgrade() *Upgrade {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rec.Upgrade == nil {
		return nil
	}
	up := *g.rec.Upgrade
	return &up
}

// Update records what change did to the upgrade on trial: its
// snapshot, that it opened the datastore.
func (g *Guard) Update(change func(*Upgrade)) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.update(change)
}

func (g *Guard) update(change func(*Upgrade)) error {
	if g.rec.Upgrade == nil {
		return nil
	}
	next := g.rec
	up := *next.Upgrade
	change(&up)
	next.Upgrade = &up
	return g.set(g.rec, next)
}

// Ready records that the running kelp became ready: an upgrade on trial
// is over, and never rolled back by the guard.
func (g *Guard) Ready() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ready = true
	running := g.cfg.Running
	if up := g.rec.Upgrade; up != nil {
		log.WithFields(logrus.Fields{"from": describe(up.From), "to": describe(up.To), "starts": up.Starts}).Info("The upgraded kelp is ready: the boot guard keeps it")
	}
	return g.set(g.rec, Record{Ready: &running, RolledBack: g.rec.RolledBack})
}

// Finish is told how the start that Begin counted ended: err is what
// the server or agent returned. A stop asked for before it was ready
// (err nil) is not counted. A failure of an upgrade's last start rolls
// the node back.
func (g *Guard) Finish(err error) error {
	return markCounted(g.finish(err))
}

func (g *Guard) finish(err error) error {
	if g == nil || g.ready {
		return err
	}
	up := g.rec.Upgrade
	if up == nil {
		return err
	}
	if err == nil {
		return g.Update(func(u *Upgrade) { u.Starts = max(u.Starts-1, 0) })
	}
	if g.cfg.Attempts == 0 || up.Starts < g.cfg.Attempts {
		log.WithError(err).WithFields(logrus.Fields{"kelp": describe(up.To), "start": up.Starts, "of": g.cfg.Attempts}).
			Warn("The upgraded kelp did not become ready")
		return err
	}
	reason := fmt.Sprintf("its %d starts ended before it became ready, the last with: %v", up.Starts, err)
	if rerr := g.rollBack(reason); rerr != nil {
		return fmt.Errorf("%w; and the boot guard cannot roll back: %v", err, rerr)
	}
	return ErrRolledBack
}

// WriteWatch returns what the apiserver of an upgrade on trial tells of
// the writes it takes from clients other than kelp's own pieces
// (apiserver.ForeignWrites), or nil when there is nothing to watch: no
// upgrade on trial, or one that took such a write already. The first
// is recorded before the apiserver serves it, so that a rollback,
// whenever it comes, keeps the datastore that holds it.
func (g *Guard) WriteWatch() func(who, what string) bool {
	up := g.Upgrade()
	if up == nil || up.Written != nil {
		return nil
	}
	return func(who, what string) bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.ready || g.rec.Upgrade == nil || g.rec.Upgrade.Written != nil {
			return false
		}
		w := Write{Who: who, What: what, At: time.Now().UTC()}
		if err := g.update(func(u *Upgrade) { u.Written = &w }); err != nil {
			log.WithError(err).Error("The boot guard cannot record a write to the datastore of the upgrade on trial; a rollback would restore the snapshot taken before it")
			return true
		}
		log.WithFields(logrus.Fields{"who": who, "what": what}).Warn("The upgraded kelp, not yet ready, took a write from a client other than kelp: " +
			"if it is rolled back, the datastore is kept as it is, this write with it, and the snapshot taken before the upgrade is left for you to restore")
		return false
	}
}

// Close releases the data dir's lock.
func (g *Guard) Close() {
	if g != nil && g.release != nil {
		g.release()
		g.release = nil
	}
}

func (g *Guard) rollBack(reason string) error {
	done, err := Rollback(g.cfg.DataDir, g.cfg.Binary, *g.rec.Upgrade)
	if err != nil {
		return err
	}
	g.rec = done.Record
	if rb := g.rec.RolledBack; rb != nil {
		rb.Reason = reason
		if err := g.rec.save(g.path); err != nil {
			log.WithError(err).Warn("The boot guard's record does not say why it rolled back")
		}
	}
	log.Errorf("Rolled back the upgrade from %s to %s, because %s: %s", describe(done.Upgrade.From), describe(done.Upgrade.To), reason, strings.Join(done.Steps, "; "))
	return nil
}

// describe names a kelp for messages.
func describe(r version.Ran) string {
	if r.Kelp == "" {
		return "the kelp that ran before"
	}
	if r.Kubernetes == "" {
		return "kelp " + r.Kelp
	}
	return fmt.Sprintf("kelp %s (Kubernetes %s)", r.Kelp, r.Kubernetes)
}

// Lock takes the data dir's lock, which the kelp server or agent running
// on dataDir holds, so it fails while one runs. role goes into the lock
// file for the message of the next one to try.
func Lock(dataDir, role string) (release func(), err error) {
	path := layout.BootGuardLock(dataDir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the data dir's lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another kelp"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if who, pid, ok := strings.Cut(strings.TrimSpace(string(b)), " "); ok {
					holder = fmt.Sprintf("another kelp %s (pid %s)", who, pid)
				}
			}
			return nil, fmt.Errorf("data dir %s is in use by %s: stop it first, or give this one a different --data-dir", dataDir, holder)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Who holds it is only a hint for the message above.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(role+" "+strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
