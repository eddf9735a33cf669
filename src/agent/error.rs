//! What goes wrong in the agent.

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("kubernetes API")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    KubeConfig(String),
    #[error("start the agent thread")]
    Thread(#[source] std::io::Error),
    #[error("runtime {call}")]
    Runtime {
        call: &'static str,
        #[source]
        status: tonic::Status,
    },
}
