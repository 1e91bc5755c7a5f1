import './palette.css';
import './base.css';
