// Package layout is the one answer to "where is X on disk". Every path kelp
// reads or writes under the data dir, /run/kelp and the kubelet root is
// spelled here and nowhere else.
//
//	/etc/kelp/config.yaml            ConfigFile (+ config.yaml.d/*.yaml)
//	/etc/kelp/kelp.yaml              Kubeconfig, the admin kubeconfig
//	/etc/kelp/registries.yaml        RegistriesFile: mirrors, auth and TLS
//	<data-dir>                       DefaultDataDir: /var/lib/kelp
//	├── data/<bundle hash>/          the staged bundle (embed.Stage)
//	├── boot-guard.json              BootGuard: the kelp that became ready, an upgrade on trial
//	├── boot-guard.lock              BootGuardLock: held by the running kelp
//	├── server/                      Server(dataDir)
//	│   ├── tls/                     CAs and leaf certificates, named by pki.FilesIn
//	│   ├── cred/                    kubeconfigs of the in-process clients
//	│   ├── db/                      state.db (SQLite) or etcd/
//	│   │   └── snapshots/           kelp snapshot save
//	│   ├── manifests/               auto-deploy manifests (package addons)
//	│   ├── static/charts/           Helm charts served at /static/charts/
//	│   ├── token, agent-token       join tokens
//	├── witness/                     Witness(dataDir): an etcd witness's
//	│   ├── tls/etcd/                its etcd certificates, named by pki.WitnessFilesIn
//	│   └── db/etcd/                 its etcd member
//	├── storage/                     local-path volumes (--default-local-storage-path)
//	└── agent/                       Agent(dataDir)
//	    ├── bin/                     kubectl, crictl, ctr links
//	    ├── tls/                     a joined node's certificates, named by pki.NodeFilesIn
//	    ├── images/                  airgap image tarballs
//	    ├── containerd/              containerd's root and its log
//	    ├── etc/                     containerd, CNI, kubelet and CoreDNS config
//	    ├── pod-manifests/           static pods
//	    ├── node-password, join.json a joined node's secret and last join
//	    ├── node-paths.json          its cgroup root and pod log dir (package nodepaths)
//	    ├── gateway-addresses.json   the Gateway addresses it holds (package gateway)
//	    ├── pod-logs/                pod logs of a node whose data dir is not the default
//	    └── *.kubeconfig             the node's clients
//	/run/kelp                        RunDir: sockets, containerd state, CNI leases
//	└── ram/<hash of data dir>/      RAMStore: a SQLite server's Leases and Events
//	/var/lib/kubelet                 KubeletRoot
//	/var/log/pods                    PodLogsDir of the default data dir's node (and
//	                                 /var/log/containers, kubelet's links, of every node)
package layout

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
)

// Fixed places on the host.
const (
	DefaultDataDir = "/var/lib/kelp"
	ConfigFile     = "/etc/kelp/config.yaml"
	Kubeconfig     = "/etc/kelp/kelp.yaml"
	RegistriesFile = "/etc/kelp/registries.yaml"
	RunDir         = "/run/kelp"
	KubeletRoot    = "/var/lib/kubelet"
	// PodLogsDir is where the kubelet of the default data dir's node
	// keeps container logs; log shippers expect it here. Other nodes keep
	// theirs in AgentPaths.PodLogs (package nodepaths).
	PodLogsDir = "/var/log/pods"
	// ContainerLogsDir holds the kubelet's links to the files in
	// PodLogsDir; the kubelet does not let it be moved.
	ContainerLogsDir = "/var/log/containers"
	NetnsDir         = "/run/netns"
)

// Under /run/kelp.
const (
	ContainerdState   = RunDir + "/containerd"
	ContainerdAddress = ContainerdState + "/containerd.sock"
	CNINetworks       = RunDir + "/cni/networks"
)

// RAMStore is where a server on SQLite keeps the datastore of what may be
// lost at a reboot (Leases and Events): under RunDir, a tmpfs, so that
// their writes never reach the disk. dataDir is absolute; each data dir
// has its own, so that a server never reads another cluster's leases.
func RAMStore(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return filepath.Join(RunDir, "ram", hex.EncodeToString(sum[:8]))
}

// BootGuard records which kelp last became ready on dataDir and the
// upgrade being tried (package bootguard); BootGuardLock is held by the
// kelp server or agent running on it.
func BootGuard(dataDir string) string     { return filepath.Join(dataDir, "boot-guard.json") }
func BootGuardLock(dataDir string) string { return filepath.Join(dataDir, "boot-guard.lock") }

// BundleDir holds the staged bundles: one directory per content hash.
func BundleDir(dataDir string) string { return filepath.Join(dataDir, "data") }

// ServerPaths are a server's files under <data-dir>/server.
type ServerPaths struct {
	Dir        string
	TLS        string // pki's directory
	DB         string // the datastore's directory
	Snapshots  string // kelp snapshot's default directory
	Token      string // joins servers and agents
	AgentToken string // joins agents only
	// Versions records which kelp and Kubernetes last ran the server.
	Versions string
	// PodSecurityDefault records the Pod Security default the cluster
	// was made with, which it keeps without --pod-security-default.
	PodSecurityDefault string
	// Files kelp writes for the apiserver: its default audit policy, its
	// admission plugins' and its authenticators' configuration.
	AuditPolicy, AdmissionConfig, AuthenticationConfig string
	// EncryptionConfig holds the keys Secrets are encrypted with;
	// ReencryptPending marks a server whose Secrets are still to be
	// rewritten with the key that writes.
	EncryptionConfig, ReencryptPending string
	// Manifests are applied to the cluster while their files exist;
	// StaticCharts are Helm charts served at /static/charts/.
	Manifests, StaticCharts string
	// Kubeconfigs of the in-process clients.
	AdminKubeconfig, ControllerManagerKubeconfig, SchedulerKubeconfig string
}

// Server lays out <data-dir>/server.
func Server(dataDir string) ServerPaths {
	dir := filepath.Join(dataDir, "server")
	tls := filepath.Join(dir, "tls")
	cred := filepath.Join(dir, "cred")
	return ServerPaths{
		Dir:                         dir,
		TLS:                         tls,
		DB:                          filepath.Join(dir, "db"),
		Snapshots:                   filepath.Join(dir, "db", "snapshots"),
		Token:                       filepath.Join(dir, "token"),
		AgentToken:                  filepath.Join(dir, "agent-token"),
		Versions:                    filepath.Join(dir, "versions.json"),
		PodSecurityDefault:          filepath.Join(dir, "pod-security-default"),
		AuditPolicy:                 filepath.Join(dir, "etc", "audit-policy.yaml"),
		AdmissionConfig:             filepath.Join(dir, "etc", "admission.yaml"),
		AuthenticationConfig:        filepath.Join(dir, "etc", "authentication.yaml"),
		EncryptionConfig:            filepath.Join(cred, "encryption-config.json"),
		ReencryptPending:            filepath.Join(cred, "encryption-config.json.reencrypt-pending"),
		Manifests:                   filepath.Join(dir, "manifests"),
		StaticCharts:                filepath.Join(dir, "static", "charts"),
		AdminKubeconfig:             filepath.Join(cred, "admin.kubeconfig"),
		ControllerManagerKubeconfig: filepath.Join(cred, "controller.kubeconfig"),
		SchedulerKubeconfig:         filepath.Join(cred, "scheduler.kubeconfig"),
	}
}

// WitnessPaths are an etcd witness's files under <data-dir>/witness
// (`kelp witness`): a voting etcd member and nothing else.
type WitnessPaths struct {
	Dir string
	TLS string // its etcd certificates, named by pki.WitnessFilesIn
	DB  string // the etcd member's directory's parent, as ServerPaths.DB
}

// Witness lays out <data-dir>/witness.
func Witness(dataDir string) WitnessPaths {
	dir := filepath.Join(dataDir, "witness")
	return WitnessPaths{Dir: dir, TLS: filepath.Join(dir, "tls"), DB: filepath.Join(dir, "db")}
}

// AgentPaths are a node's files under <data-dir>/agent.
type AgentPaths struct {
	Dir, BinDir, ImagesDir, StaticPods string
	LocalStorage                       string // default of --default-local-storage-path
	ContainerdRoot, ContainerdConfig   string
	ContainerdLog, AirgapImagesState   string
	RegistryDir, CNIConfDir            string
	KubeletConfig, Corefile            string
	TLS, NodePassword, SavedJoin       string
	// NodePaths records the node's cgroup root and pod log dir; PodLogs
	// is the pod log dir of a node whose data dir is not the default.
	NodePaths, PodLogs                  string
	Kubeconfig, ProxyKubeconfig         string
	DNSKubeconfig, ControllerKubeconfig string
	// GatewayAddresses records the Gateway addresses the node holds on
	// its interfaces.
	GatewayAddresses string
	// Upgrades holds the kelp binaries an Upgrade's path names (airgap);
	// UpgradePending records the upgrade this node swapped its kelp for,
	// which the next start reports.
	Upgrades, UpgradePending string
}

// Agent lays out <data-dir>/agent.
func Agent(dataDir string) AgentPaths {
	dir := filepath.Join(dataDir, "agent")
	etc := filepath.Join(dir, "etc")
	containerdRoot := filepath.Join(dir, "containerd")
	return AgentPaths{
		Dir:                  dir,
		BinDir:               filepath.Join(dir, "bin"),
		ImagesDir:            filepath.Join(dir, "images"),
		StaticPods:           filepath.Join(dir, "pod-manifests"),
		LocalStorage:         filepath.Join(dataDir, "storage"),
		ContainerdRoot:       containerdRoot,
		ContainerdConfig:     filepath.Join(etc, "containerd", "config.toml"),
		ContainerdLog:        filepath.Join(containerdRoot, "containerd.log"),
		AirgapImagesState:    filepath.Join(containerdRoot, "kelp-airgap-images.json"),
		RegistryDir:          filepath.Join(etc, "containerd", "certs.d"),
		CNIConfDir:           filepath.Join(etc, "cni", "net.d"),
		KubeletConfig:        filepath.Join(etc, "kubelet.yaml"),
		Corefile:             filepath.Join(etc, "Corefile"),
		TLS:                  filepath.Join(dir, "tls"),
		NodePassword:         filepath.Join(dir, "node-password"),
		SavedJoin:            filepath.Join(dir, "join.json"),
		Upgrades:             filepath.Join(dir, "upgrades"),
		UpgradePending:       filepath.Join(dir, "upgrade-pending.json"),
		NodePaths:            filepath.Join(dir, "node-paths.json"),
		GatewayAddresses:     filepath.Join(dir, "gateway-addresses.json"),
		PodLogs:              filepath.Join(dir, "pod-logs"),
		Kubeconfig:           filepath.Join(dir, "kubelet.kubeconfig"),
		ProxyKubeconfig:      filepath.Join(dir, "kubeproxy.kubeconfig"),
		DNSKubeconfig:        filepath.Join(dir, "dns.kubeconfig"),
		ControllerKubeconfig: filepath.Join(dir, "controller.kubeconfig"),
	}
}
