//! Embeddings and reranking: one pooled forward pass per input over the whole sequence.
//! Embeddings use the GGUF's pooling and are L2-normalized; reranking uses rank pooling per
//! (query, document) pair.

use hangar_backend::{EmbedRequest, Embeddings, RerankRequest, Rerankings, RuntimeError};
use hangar_config::ModelType;
use llama_cpp_2::token::LlamaToken;
use tokio::sync::mpsc;

use super::{Command, Worker, count, failed, unsupported};

impl Worker<'_> {
    /// An embedding or reranking model's loop: one command after another until the channel
    /// closes or a sleep is asked (each input is one pooled pass over the whole context).
    pub(super) fn serve_one_by_one(&mut self, commands: &mut mpsc::Receiver<Command>) {
        while let Some(command) = commands.blocking_recv() {
            match command {
                Command::Generate { reply, .. } => {
                    let _ = reply.send(Err(unsupported("generate", self.spec.model_type)));
                }
                Command::Embed { request, reply } => {
                    let _ = reply.send(self.embed(&request));
                }
                Command::Rerank { request, reply } => {
                    let _ = reply.send(self.rerank(&request));
                }
                Command::Slots { reply } => {
                    let _ = reply.send(Vec::new());
                }
                Command::Sleep { reply } => {
                    self.ask_sleep(reply);
                    return;
                }
                Command::Wake { reply } => {
                    let _ = reply.send(Ok(()));
                }
            }
        }
    }

    /// Tokens of one embedding or rerank input, checked against the context.
    fn checked(&self, tokens: Vec<LlamaToken>) -> Result<Vec<LlamaToken>, RuntimeError> {
        let limit = self.n_ctx().min(self.context.n_ubatch() as usize);
        if tokens.is_empty() {
            return Err(RuntimeError::InvalidRequest { message: "empty input".to_owned() });
        }
        if tokens.len() > limit {
            return Err(RuntimeError::InvalidRequest {
                message: format!("input is {} tokens, at most {limit} fit", tokens.len()),
            });
        }
        Ok(tokens)
    }

    /// The pooled output of one sequence (mean over tokens when the model pools nothing).
    fn pooled(&mut self, tokens: &[LlamaToken]) -> Result<Vec<f32>, RuntimeError> {
        self.context.clear_kv_cache();
        self.decode(tokens, 0, true)?;
        if let Ok(v) = self.context.embeddings_seq_ith(0) {
            return Ok(v.to_vec());
        }
        let mut sum: Vec<f32> = Vec::new();
        for i in 0..tokens.len() {
            let e = self
                .context
                .embeddings_ith(i32::try_from(i).map_err(failed)?)
                .map_err(|e| failed(format!("no embeddings from llama.cpp: {e}")))?;
            if sum.is_empty() {
                sum = vec![0.0; e.len()];
            }
            sum.iter_mut().zip(e).for_each(|(s, x)| *s += x);
        }
        let n = tokens.len() as f32;
        sum.iter_mut().for_each(|s| *s /= n);
        Ok(sum)
    }

    pub(super) fn embed(&mut self, request: &EmbedRequest) -> Result<Embeddings, RuntimeError> {
        if self.spec.model_type != ModelType::Embedding {
            return Err(unsupported("embed", self.spec.model_type));
        }
        let mut vectors = Vec::with_capacity(request.inputs.len());
        let mut prompt_tokens = 0u32;
        for input in &request.inputs {
            let tokens =
                self.checked(self.model.vocab().tokenize(input.as_bytes(), true, false))?;
            prompt_tokens = prompt_tokens.saturating_add(count(tokens.len()));
            let mut v = self.pooled(&tokens)?;
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > f32::EPSILON {
                v.iter_mut().for_each(|x| *x /= norm);
            }
            vectors.push(v);
        }
        Ok(Embeddings { vectors, prompt_tokens })
    }

    /// `[BOS] query [EOS] [SEP] document [EOS]`, each special token where the vocab uses it
    /// (llama.cpp server's rerank layout for models without a rerank template).
    fn rerank_tokens(&self, query: &str, document: &str) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let mut tokens = Vec::new();
        let special = |t: LlamaToken| t.0 >= 0;
        if vocab.should_add_bos() && special(vocab.bos()) {
            tokens.push(vocab.bos());
        }
        tokens.extend(vocab.tokenize(query.as_bytes(), false, false));
        let eos = if special(vocab.eos()) { vocab.eos() } else { vocab.sep() };
        if special(eos) {
            tokens.push(eos);
        }
        if vocab.should_add_sep() && special(vocab.sep()) && vocab.sep() != eos {
            tokens.push(vocab.sep());
        }
        tokens.extend(vocab.tokenize(document.as_bytes(), false, false));
        if special(eos) {
            tokens.push(eos);
        }
        tokens
    }

    pub(super) fn rerank(&mut self, request: &RerankRequest) -> Result<Rerankings, RuntimeError> {
        if self.spec.model_type != ModelType::Reranking {
            return Err(unsupported("rerank", self.spec.model_type));
        }
        let mut scores = Vec::with_capacity(request.documents.len());
        let mut prompt_tokens = 0u32;
        for document in &request.documents {
            let tokens = self.checked(self.rerank_tokens(&request.query, document))?;
            prompt_tokens = prompt_tokens.saturating_add(count(tokens.len()));
            let out = self.pooled(&tokens)?;
            scores.push(out.first().copied().ok_or_else(|| failed("empty rank output"))?);
        }
        Ok(Rerankings { scores, prompt_tokens })
    }
}
