package datastore

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// restoreRevisionBump raises the restored revision above any a client saw
// before, and marks the older ones compacted, so that the apiserver's
// watches and caches start over instead of missing changes.
const restoreRevisionBump = 1_000_000_000

// EtcdMember names the embedded etcd member a restore makes.
type EtcdMember struct {
	Name        string // node name
	AdvertiseIP string // where peers reach it
}

// RestoreEtcd replaces the embedded etcd data of dataDir with a new
// one-member cluster made from the etcd snapshot at path, which the caller
// has verified. The server must be stopped. The replaced data is kept
// aside (MoveAside); where it went is returned, "" when there was none.
func RestoreEtcd(dataDir, path string, member EtcdMember) (aside string, err error) {
	db, err := dbDirOf(dataDir)
	if err != nil {
		return "", err
	}
	if err := makePrivateDir(db); err != nil {
		return "", err
	}
	lock, err := lockDir(db)
	if err != nil {
		return "", fmt.Errorf("%w: an etcd snapshot is restored while kelp server is stopped", err)
	}
	defer lock.release()

	now := time.Now()
	staging := filepath.Join(db, etcdDirName+".restoring-"+now.UTC().Format(asideTime))
	if err := buildMember(staging, path, member, restoreRevisionBump); err != nil {
		return "", err
	}
	aside, err = replace(dataDir, KindEtcd, staging, AsideRestore, now)
	if err != nil {
		os.RemoveAll(staging)
	}
	return aside, err
}

// buildMember makes in dir, for the caller to put in place, the data of a
// new one-member etcd cluster from the etcd snapshot at path, its revision
// raised by bump and the revisions below it marked compacted.
func buildMember(dir, path string, member EtcdMember, bump uint64) error {
	peer := (&url.URL{Scheme: "https", Host: net.JoinHostPort(orDefault(member.AdvertiseIP, "127.0.0.1"), strconv.Itoa(defaultEtcdPeerPort))}).String()
	err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        path,
		Name:                member.Name,
		OutputDataDir:       dir,
		PeerURLs:            []string{peer},
		InitialCluster:      member.Name + "=" + peer,
		InitialClusterToken: "kelp",
		RevisionBump:        bump,
		MarkCompacted:       true,
	})
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("restore etcd snapshot %s: %w; nothing was changed", path, err)
	}
	return nil
}
